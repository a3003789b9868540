"""This start's choices of native paths, made once each: read from the tuning file where it
holds one for this machine and model (engine/step/choices/tuning.py), else timed now and saved
there; or pinned by an engine option, or fixed where only one path can run. The choosers
(engine/step/decode_backend.py, prefill_backend.py, native_matmul.py) ask it, log one line per
choice with `StartupChoice.origin()`, and the engine's /metrics shows what it holds.

Invariant: with a tuning file, two starts whose keys are equal make the same choices, unless a
saved path cannot run at the second (its kernel no longer builds): that one is timed again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from pathlib import Path

import torch

from engine.config import EngineConfig
from engine.models.hf_config import ModelConfig
from engine.step.choices.choice import StartupChoice
from engine.step.choices.cpu_load import others_busy_cores
from engine.step.choices.tuning import (
    TimedChoice,
    TuningKey,
    default_tuning_file,
    read_choices,
    save_choices,
    tuning_key,
)
from engine.step.threads import available_cores

log = logging.getLogger(__name__)

# Other processes busy on more than this share of the engine's cores while it times: say so.
_BUSY_SHARE = 0.25


class StartupChoices:
    """`key` and `path` None: no tuning file, every choice timed at this start (what a chooser
    called on its own gets). `retune`: the file's choices are not read, and the new timings
    replace them."""

    def __init__(
        self,
        key: TuningKey | None = None,
        path: Path | None = None,
        *,
        retune: bool = False,
        probe: Callable[[], float | None] = others_busy_cores,
    ):
        self.key, self.path = key, path
        self._saved: dict[str, TimedChoice] = {}
        if key is not None and path is not None and not retune:
            self._saved = read_choices(path, key)
        if any(choice.under_load for choice in self._saved.values()):
            log.warning(
                "the start-up choices saved in %s were timed while other processes kept this "
                "machine's cores busy, and may be slower paths than a quiet machine would pick: "
                "run `loragate engine --tune` on a quiet machine to time them again",
                path,
            )
        self._probe = probe
        self._load: tuple[str, bool] | None = None  # the note for the figures, and whether busy
        self.made: dict[str, StartupChoice] = {}

    @classmethod
    def for_engine(
        cls, config: EngineConfig, model: ModelConfig, dtype: torch.dtype, num_threads: int
    ) -> StartupChoices:
        if config.tuning == "off":
            return cls()
        path = Path(config.tuning_file) if config.tuning_file else default_tuning_file()
        key = tuning_key(model, dtype, num_threads)
        choices = cls(key, path, retune=config.tuning == "tune")
        if config.tuning == "tune":
            log.info("start-up choices: all timed again (tune), to replace those in %s", path)
        else:
            log.info("start-up choices: tuning file %s (%d saved for this machine and model)",
                     path, len(choices._saved))  # fmt: skip
        return choices

    def decide(
        self, name: str, allowed: Collection[str], time_it: Callable[[], tuple[str, str]]
    ) -> StartupChoice:
        """The saved value, where the file has one that can run here (one of `allowed`); else
        `time_it()`'s (value, figures), saved."""
        saved = self._saved.get(name)
        if saved is not None and saved.value in allowed:
            return self._made(StartupChoice(
                name, saved.value, "saved", saved.figures, str(self.path), saved.timed_at
            ))  # fmt: skip
        if saved is not None:
            log.warning("tuning file %s: %s %r cannot run here now (%s can); timing again",
                        self.path, name, saved.value, ", ".join(allowed))  # fmt: skip
        load, busy = self._machine_load()
        value, figures = time_it()
        timed = TimedChoice.now(value, f"{figures}; {load}" if load else figures, under_load=busy)
        saved_to = None
        if (
            self.key is not None
            and self.path is not None
            and save_choices(self.path, self.key, {name: timed})
        ):
            saved_to = str(self.path)
        return self._made(
            StartupChoice(name, value, "timed", timed.figures, saved_to, timed.timed_at)
        )

    def pin(self, name: str, value: str, option: str) -> StartupChoice:
        return self._made(StartupChoice(name, value, "pinned", f"pinned by {option}"))

    def fix(self, name: str, value: str, why: str) -> StartupChoice:
        return self._made(StartupChoice(name, value, "fixed", why))

    def _made(self, choice: StartupChoice) -> StartupChoice:
        self.made[choice.name] = choice
        return choice

    def _machine_load(self) -> tuple[str, bool]:
        """How busy other processes kept this process's cores when this start first timed
        (measured then, once; only where the timings are saved), as a note for the figures, and
        whether that was enough to skew them (then a warning says so)."""
        if self.key is None or self.path is None:
            return "", False
        if self._load is None:
            others, cores = self._probe(), available_cores()
            busy = others is not None and others > _BUSY_SHARE * cores
            note = (
                "" if others is None else f"other processes kept {others:.1f} of {cores} cores busy"
            )
            self._load = (note, busy)
            if busy:
                log.warning(
                    "%s while this engine timed its start-up choices, which may have picked "
                    "slower paths; they are saved in %s and every later start keeps them: run "
                    "`loragate engine --tune` on a quiet machine to time them again",
                    note, self.path,
                )  # fmt: skip
        return self._load
