"""--completion-windows: OpenAI's 24h and the listed windows, each from 1 hour to 7 days; a
window outside that range, or not a window, is refused at start with the reason."""

from __future__ import annotations

import pytest

from app.config.settings import Settings


def test_the_default_allows_1h_24h_and_7d_shortest_first() -> None:
    assert Settings().allowed_windows == {"1h": 3600, "24h": 86400, "7d": 604800}


def test_24h_is_allowed_whatever_is_listed_and_each_window_has_its_length() -> None:
    s = Settings(completion_windows="48h, 90m")
    assert s.allowed_windows == {"90m": 5400, "24h": 86400, "48h": 172800}
    assert s.window_seconds("90m") == 5400 and s.window_seconds("48h") == 172800
    assert Settings(completion_windows="").allowed_windows == {"24h": 86400}


def test_a_fixed_window_length_overrides_every_window() -> None:
    s = Settings(batch_window_seconds=2)
    assert s.window_seconds("1h") == 2 and s.window_seconds("7d") == 2


@pytest.mark.parametrize(
    ("listed", "message"),
    [
        ("30m", "'30m' is outside the windows batchyard allows (1 hour to 7 days)"),
        ("8d", "'8d' is outside the windows batchyard allows (1 hour to 7 days)"),
        ("1h,2 hours", "takes windows such as 1h, 90m, 48h or 7d, not '2 hours'"),
        ("3600", "takes windows such as 1h, 90m, 48h or 7d, not '3600'"),
        ("0h", "not '0h'"),
    ],
)
def test_a_window_outside_the_range_is_refused(listed: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Settings(completion_windows=listed)


def test_the_flag_and_the_env_variable_set_it() -> None:
    loaded = Settings.load({}, environ={"BATCHYARD_COMPLETION_WINDOWS": "2h,3d"})
    assert list(loaded.allowed_windows) == ["2h", "24h", "3d"]
    assert Settings.load({"completion_windows": "6h"}).allowed_windows == {
        "6h": 21600,
        "24h": 86400,
    }
