"""Exploration (not a recording): the compiled training step with the package's kernels on a GPU.

Checks that the attention ops compile without graph breaks and recompiles over changing layouts,
times the end-to-end suite's stacks in this process (fewer steps than the suite), profiles the
fastest of ours, and looks into why ``compile`` (default mode, each batch's own rows) is slow on
pretraining. Usage: python scripts/explore_compiled_step.py [small|large|all]
"""

import sys
import time

import torch

from attn_gym_lite.bench import end_to_end as e2e
from attn_gym_lite.data import load_tokenizer


def layouts_compile_once():
    """One compiled loss over changing cu_seqlens: graph breaks and frames compiled, values vs eager."""
    from torch._dynamo.utils import counters

    from attn_gym_lite.models import PackedTransformer

    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    model = PackedTransformer(1000, 256, 4, 2, device="cuda", dtype=torch.bfloat16)
    compiled = torch.compile(model.loss)
    worst = 0.0
    for lengths in ([300, 200, 12], [512], [1, 2, 3, 400], [100] * 5, [0, 7, 505]):
        T, L = 512, sum(lengths)
        cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()] + [L] * (8 - len(lengths)),
                          dtype=torch.int32, device="cuda")
        ids = torch.randint(0, 1000, (T,), device="cuda")
        mask = torch.arange(T, device="cuda") < L - 1
        a, b = compiled(ids, ids, mask, cu), model.loss(ids, ids, mask, cu)
        worst = max(worst, abs(a.item() - b.item()))
    print("compile over 5 layouts: |loss - eager| max", worst, "frames", dict(counters["frames"]),
          "graph breaks", dict(counters["graph_break"]), "recompiles", dict(counters["recompiles"]), flush=True)


def time_stacks(config, workloads, stacks, steps):
    config = {**config, "steps": steps, "warmup": min(config["warmup"], steps // 3)}
    tokenizer = load_tokenizer()
    for workload in workloads:
        batches = e2e.workload_batches(workload, steps, config, tokenizer=tokenizer)
        m = [b.active_sequences for b in batches]
        print(f"{config['size']} {workload}: M per batch min {min(m)} median {sorted(m)[len(m) // 2]} max {max(m)}, "
              f"fill {sum(b.active_tokens for b in batches) / len(batches) / config['T']:.3f}", flush=True)
        path = f"/tmp/{workload}.pt"
        torch.save(batches, path)
        for stack in stacks:
            began = time.perf_counter()
            try:
                r = e2e.run_stack(workload, stack, path, config)
                print(f"  {stack:42s} {r['tokens_per_s'] / 1e6:6.3f}M tok/s  spread {r['tokens_per_s_spread']:.3f}  "
                      f"mfu {r.get('mfu', 0):.3f}  setup {r['setup_s']:5.1f}s  peak {r['peak_allocated_mib']:.0f} MiB  "
                      f"loss {r['losses'][-1]:.3f}  ({time.perf_counter() - began:.0f}s)", flush=True)
                if "dynamo" in r:
                    print("     dynamo", {k: v for k, v in r["dynamo"].items() if v}, flush=True)
            except Exception as error:  # an exploration goes on
                print(f"  {stack:42s} FAILED {type(error).__name__}: {str(error)[:600]}", flush=True)
            torch._dynamo.reset()
            torch.cuda.empty_cache()


def profile_stack(config, workload, stack, steps=12):
    from torch.profiler import ProfilerActivity, profile

    batches = e2e.workload_batches(workload, steps, {**config, "steps": steps})
    model_args = {"vocab_size": load_tokenizer().vocab_size, "dim": config["dim"], "num_heads": config["num_heads"],
                  "num_layers": config["num_layers"]}
    step, fed = e2e._build(stack, model_args, [b.pin_memory() for b in batches], config)
    for b in fed[:8]:
        step(b)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for b in fed[8:11]:
            step(b)
        torch.cuda.synchronize()
    print(f"profile {config['size']} {workload} {stack}: 3 steps", flush=True)
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=18, max_name_column_width=60), flush=True)
    print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=10, max_name_column_width=60), flush=True)
    torch._dynamo.reset()


def main(which):
    layouts_compile_once()
    if which in ("small", "all"):
        time_stacks(e2e.CONFIG, e2e.WORKLOADS,
                    ("compile reduce-overhead, fixed capacity", "compile + graph varlen_attn", "graph ours",
                     "compile + graph ours", "buckets ours", "compile + buckets ours"), 36)
        profile_stack(e2e.CONFIG, "pretraining", "compile + graph ours")
        profile_stack({**e2e.CONFIG, "steps": 12}, "pretraining", "compile")
    if which in ("large", "all"):
        time_stacks(e2e.LARGE, e2e.WORKLOADS, ("compile + graph varlen_attn", "graph ours", "compile + graph ours",
                                               "compile + buckets ours"), 18)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "all")
