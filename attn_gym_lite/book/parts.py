"""What a suite's recording holds of each of its parts, said in words a chapter can print.

A suite records each part under its own key; a part that failed, timed out or was never started
(its budget spent) leaves a message under `errors` instead. Chapter 9 shows its recording part by
part, and where a number is missing the prose says why, from the suite's own message.
"""


class RecordedParts:
    def __init__(self, recorded: dict | None, parts):
        self.recorded, self.parts = recorded, tuple(parts)

    def kind(self, part) -> tuple[str, str | None]:
        """("no recording" | "recorded" | "absent" | "not run" | "timed out" | "failed", the message)."""
        if self.recorded is None:
            return "no recording", None
        error = self.recorded.get("errors", {}).get(part)
        if error is None:
            return ("recorded" if part in self.recorded else "absent"), None
        if error.startswith("not run:"):
            return "not run", error
        if error.startswith("IsolatedRunError:") and " timed out after " in error:
            return "timed out", error
        return "failed", error

    def state(self, part) -> str:
        """The part's state as a phrase: "the overcapture part: <state>"."""
        kind, error = self.kind(part)
        if kind == "recorded":
            inner = (self.recorded.get(part) or {}).get("errors")
            return "recorded" + (", with errors of its own (printed with it)" if inner else "")
        if kind == "not run":
            return "not run, no time being left of the suite's budget" if "budget" in error else "not run"
        if kind == "failed":
            return f"failed with {error.split(':')[0]}"
        return {"no recording": "not recorded yet", "absent": "not in the recording", "timed out": "timed out"}[kind]

    def why_missing(self, part) -> str:
        kind, error = self.kind(part)
        if kind == "recorded":
            inner = (self.recorded.get(part) or {}).get("errors")
            return f"it ran, with errors {inner}" if inner else "it ran but holds nothing to show here"
        if kind in ("not run", "timed out"):  # the suite's message says so itself
            return error
        return f"failed: {error}" if kind == "failed" else self.state(part)

    def not_shown(self, part):
        print(f"Not shown: the {part} part ({self.why_missing(part)}).")

    def unmeasured(self, part) -> str:
        """What the prose shows where a number of `part` would stand."""
        kind, _ = self.kind(part)
        if kind == "no recording":
            return "(not recorded yet)"
        if kind == "recorded":
            return f"(not measured: the recording's {part} part ran, see its errors above)"
        if kind == "absent":
            return f"(not measured: the recording has no {part} part)"
        return f"(not measured: the recording's {part} part {'was ' if kind == 'not run' else ''}{self.state(part)})"

    @property
    def held(self) -> list[str]:
        return [p for p in self.parts if self.kind(p)[0] == "recorded"]

    def contents(self) -> str:
        """One line: the parts held, then those missing with their states."""
        if self.recorded is None:
            return "none, as no recording ships with this version of the package"
        missing = ", ".join(f"{p} ({self.state(p)})" for p in self.parts if p not in self.held)
        return f"{', '.join(self.held) or 'none'}; missing: {missing or 'none'}"

    def status(self) -> str:
        """A Markdown paragraph for the top of the chapter: what the cells below can show."""
        if self.recorded is None:
            return ("**Not recorded yet.** This version of the package ships no recording of this suite: it is "
                    "written, and its parts are tested on the CPU and its kernels on the H200, but the suite itself "
                    "has not run there yet. The cells below say so where a recorded number would stand, and the "
                    "book claims no timing for KDA until it has.")
        lacking = {}
        for p in self.parts:
            if p not in self.held:
                lacking.setdefault(self.state(p), []).append(p)
        if not lacking:
            return "The cells below show the recording named at the top of the chapter, which holds every part."

        def names(parts):
            return " and ".join(", ".join(f"`{p}`" for p in parts).rsplit(", ", 1))

        return (f"Of these parts, the recording named at the top of the chapter holds "
                f"{'only ' if self.held else ''}{names(self.held) or 'none'}. It lacks "
                + "; ".join(f"{names(parts)} ({state})" for state, parts in lacking.items())
                + ": the cells below print the suite's message for each, the prose says where a number from them "
                  "would stand, and the book claims no KDA timing that the recording does not hold.")
