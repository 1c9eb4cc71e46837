"""The check that decides whether llama.cpp's extra CPU buffer types are used."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from app.config import Settings, bundled_model_path
from app.engine.llama import selfcheck
from app.toolchain import cpu_check, facts


def child(code: str) -> list[str]:
    """A stand-in for the check's child process."""
    return [sys.executable, "-c", code]


CRASH = child("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")  # a broken AMX kernel
MISMATCH = child(f"print({facts.ANSWER!r} + 'row 0: logits correlate at 0.012')")
INTERRUPTED = child("raise KeyboardInterrupt")  # a Ctrl-C of the whole process group


def test_agree_accepts_close_logits_and_refuses_unrelated_ones() -> None:
    rng = __import__("numpy").random.default_rng(0)
    plain = rng.normal(size=(3, 500))
    close = plain + rng.normal(scale=0.01, size=plain.shape)
    assert selfcheck._agree(plain.tolist(), close.tolist()) is None
    unrelated = rng.normal(size=plain.shape)
    assert "correlate" in (selfcheck._agree(plain.tolist(), unrelated.tolist()) or "")
    broken = close.copy()
    broken[1, 7] = float("nan")
    assert selfcheck._agree(plain.tolist(), broken.tolist()) == "row 1: non-finite logits"


@pytest.mark.parametrize(
    ("command", "why"),
    [(CRASH, "the check crashed (SIGSEGV)"), (MISMATCH, "row 0: logits correlate at 0.012")],
)
def test_a_crash_or_a_mismatch_is_a_verdict_for_plain_buffers(command: list[str], why: str) -> None:
    assert cpu_check.probe(bundled_model_path(), 1, command) == (False, why, True)


def test_an_interrupted_check_means_plain_buffers_this_time_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ok, why, final = cpu_check.probe(bundled_model_path(), 1, INTERRUPTED)
    assert (ok, final) == (False, False)
    assert why == "the check ended without an answer (exit code -2)"  # SIGINT
    monkeypatch.setattr(cpu_check, "probe", lambda *a, **k: (False, why, False))
    assert cpu_check.extra_buffers(bundled_model_path(), 2, "auto", tmp_path) == (False, why)
    assert not (tmp_path / "cpu-check.json").exists()  # the next start checks again


def test_the_real_check_answers_and_is_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = bundled_model_path()
    ok, why = cpu_check.extra_buffers(model, 2, "auto", tmp_path)
    # Either answer is right for some build; what matters is that it is a verdict with a reason.
    assert why == "the check passed" if ok else why.startswith(("the check crashed", "row "))
    cached = json.loads((tmp_path / "cpu-check.json").read_text())
    assert list(cached.values()) == [{"ok": ok, "why": why}]

    def no_probe(*args: object, **kw: object) -> tuple[bool, str, bool]:
        raise AssertionError("the cached answer should have been used")

    monkeypatch.setattr(cpu_check, "probe", no_probe)
    assert cpu_check.extra_buffers(model, 2, "auto", tmp_path) == (ok, why + " (cached)")
    # Another thread count is another key: the check would run again.
    with pytest.raises(AssertionError, match="cached answer"):
        cpu_check.extra_buffers(model, 1, "auto", tmp_path)


@pytest.mark.parametrize(
    ("value", "expected"), [("1", True), ("on", True), ("0", False), ("off", False)]
)
def test_the_setting_overrides_the_check(
    value: str, expected: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # BATCHYARD_CPU_EXTRA_BUFFERS reaches the check through Settings, like every other knob.
    settings = Settings.load(
        environ={"BATCHYARD_CPU_EXTRA_BUFFERS": value, "BATCHYARD_CACHE_DIR": str(tmp_path)}
    )
    assert settings.cache_path == tmp_path
    monkeypatch.setattr(cpu_check, "probe", lambda *a, **k: (_ for _ in ()).throw(AssertionError))
    assert cpu_check.extra_buffers(
        bundled_model_path(), 2, settings.cpu_extra_buffers, settings.cache_path
    ) == (expected, f"cpu_extra_buffers={'on' if expected else 'off'}")
    assert not (tmp_path / "cpu-check.json").exists()


def test_the_setting_defaults_to_the_check_and_refuses_other_words() -> None:
    assert Settings.load(environ={}).cpu_extra_buffers == "auto"
    assert Settings(cpu_extra_buffers=" OFF ").cpu_extra_buffers == "off"
    with pytest.raises(ValueError, match="choose one of auto, on, off"):
        Settings(cpu_extra_buffers="sometimes")
