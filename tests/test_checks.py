"""The shared argument checks: what they accept, what they return, and the words of their refusals."""

import math

import pytest

from attn_gym_lite.checks import check_choices, check_keys, check_real


def test_check_real_bounds_inclusive_and_exclusive():
    assert check_real("x", 3) == 3.0 and isinstance(check_real("x", 3), float)
    assert check_real("x", 0.0, minimum=0.0) == 0.0  # minimum is inclusive
    assert check_real("x", 1e-300, above=0.0) == 1e-300  # above is exclusive
    with pytest.raises(ValueError, match=r"x must be a finite real number > 0.0, got 0.0"):
        check_real("x", 0.0, above=0.0)
    with pytest.raises(ValueError, match=r"x must be a finite real number > 1.0 <= 2.0, got 2.5"):
        check_real("x", 2.5, above=1.0, maximum=2.0)
    with pytest.raises(ValueError, match=r"x must be a finite real number >= 0, got nan"):
        check_real("x", math.nan, minimum=0)
    with pytest.raises(TypeError, match=r"x must be a finite real number > 0.0, got True"):
        check_real("x", True, above=0.0)


def test_check_choices_returns_a_tuple_and_names_the_entry():
    assert check_choices("modes", ["eager", "graph"], ("eager", "graph")) == ("eager", "graph")
    with pytest.raises(ValueError, match=r"modes\[1\] must be one of \('eager', 'graph'\), got 'graf'"):
        check_choices("modes", ("eager", "graf"), ("eager", "graph"))
    with pytest.raises(TypeError, match=r"got the string 'eager'"):
        check_choices("modes", "eager", ("eager", "graph"))
    with pytest.raises(TypeError, match=r"got set"):
        check_choices("modes", {"eager"}, ("eager", "graph"))
    with pytest.raises(ValueError, match=r"must name at least one of"):
        check_choices("modes", [], ("eager", "graph"))


def test_check_keys_lists_what_is_missing():
    config = {"T": 1, "dim": 2, "extra": 3}
    assert check_keys("config", config, ("T", "dim")) is config
    with pytest.raises(ValueError, match=r"config must be a dict with the keys \['T', 'dim', 'lr'\], missing \['lr'\]"):
        check_keys("config", config, ("T", "dim", "lr"))
    with pytest.raises(TypeError, match=r"config must be a dict with the keys \['T'\], got list"):
        check_keys("config", [("T", 1)], ("T",))


def test_check_device_parses_and_refuses_by_name():
    import numpy as np
    import torch

    from attn_gym_lite.checks import check_device, check_factory

    assert check_device("device", "cpu") == torch.device("cpu")
    assert check_device("device", torch.device("cpu")) == torch.device("cpu")
    assert check_device("device", "meta") == torch.device("meta")
    with pytest.raises(ValueError, match=r"where must be a device that holds values \(not 'meta'\), got meta"):
        check_device("where", "meta", allow_meta=False)
    with pytest.raises(ValueError, match=r"where must be a torch.device, a device string .*, got 'foo'"):
        check_device("where", "foo")
    for bad in (True, 1.5, None, [0]):
        with pytest.raises(TypeError, match=r"where must be a torch.device, a device string"):
            check_device("where", bad)
    with pytest.raises(ValueError, match=r"where must be an int >= 0, got -1"):
        check_device("where", -1)
    if not torch.cuda.is_available():
        for bad in ("cuda", "cuda:3", torch.device("cuda"), 0, np.int64(0)):
            with pytest.raises(ValueError, match=r"where must be .*available"):
                check_device("where", bad)
    else:
        assert check_device("where", 0).type == "cuda"
        past = f"cuda:{torch.cuda.device_count()}"
        with pytest.raises(ValueError, match=rf"where must be a CUDA device index in .*, got {past}"):
            check_device("where", past)
    assert check_factory() == {"device": None, "dtype": None}
    assert check_factory("cpu", torch.float64) == {"device": torch.device("cpu"), "dtype": torch.float64}
    with pytest.raises(TypeError, match=r"dtype must be a floating torch.dtype or None, got torch.int64"):
        check_factory(None, torch.int64)
    with pytest.raises(ValueError, match=r"device must be a torch.device, a device string"):
        check_factory("foo")


def test_check_fill_keeps_what_the_dtype_holds():
    import torch

    from attn_gym_lite.checks import check_fill

    assert check_fill("v", 255, torch.uint8) == 255 and check_fill("v", 2.0, torch.int8) == 2.0
    assert check_fill("v", True, torch.bool) is True and math.isnan(check_fill("v", math.nan, torch.bfloat16))
    with pytest.raises(ValueError, match=r"v must be an integral value in \[-128, 127\] \(a fill for torch.int8\), got 128"):
        check_fill("v", 128, torch.int8)
    with pytest.raises(TypeError, match=r"v must be a number \(a fill for torch.int8\), got NoneType None"):
        check_fill("v", None, torch.int8)
    with pytest.raises(ValueError, match=r"v must be within torch.complex64's range"):
        check_fill("v", complex(0, 1e300), torch.complex64)
