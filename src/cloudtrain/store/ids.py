"""Run ids and default run names.

A run id is 12 lowercase base-36 characters: 8 for the creation time in milliseconds
(fixed width, so ids sort by creation time until the year 2059) and 4 random ones
(drawn from 0.8 million values per millisecond, then counted up within a process; the
store retries on the rare collision between processes).
A default name is readable and easy to type: "<kind>-<adjective>-<noun>".
"""

from __future__ import annotations

import secrets
import threading
import time

ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyz"
ID_LENGTH = 12
_TIME_CHARS = 8
_RANDOM_CHARS = ID_LENGTH - _TIME_CHARS

_ADJECTIVES = (
    "amber", "brave", "calm", "clever", "crisp", "dusty", "eager", "fast", "gentle",
    "golden", "green", "happy", "icy", "jolly", "keen", "lively", "lucky", "mellow",
    "misty", "noble", "odd", "plain", "proud", "quick", "quiet", "rapid", "red", "rusty",
    "shiny", "silent", "silver", "sleepy", "smooth", "snowy", "solid", "steady", "sunny",
    "swift", "tidy", "vivid", "warm", "wild", "wise", "young", "zesty",
)  # fmt: skip
_NOUNS = (
    "badger", "bison", "cedar", "comet", "crane", "dingo", "eagle", "falcon", "fern",
    "finch", "fox", "gecko", "heron", "ibis", "jaguar", "koala", "lark", "lemur", "lynx",
    "maple", "marten", "moose", "newt", "oak", "orca", "otter", "owl", "panda", "pike",
    "puma", "quail", "raven", "robin", "salmon", "seal", "sparrow", "swan", "tiger",
    "trout", "viper", "walrus", "willow", "wolf", "yak", "zebra",
)  # fmt: skip


def _base36(value: int, width: int) -> str:
    chars = []
    for _ in range(width):
        value, digit = divmod(value, 36)
        chars.append(ALPHABET[digit])
    return "".join(reversed(chars))


_last = [0, 0]  # (millis, random part) of the last id this process made
_last_lock = threading.Lock()


def new_run_id(now_unix_s: float | None = None) -> str:
    """A fresh 12-character id that sorts after ids made earlier.

    Within one process ids strictly increase (a second id in the same millisecond takes
    the previous random part plus one); across processes the random part keeps them apart.
    """
    millis = int((time.time() if now_unix_s is None else now_unix_s) * 1000)
    with _last_lock:
        if millis <= _last[0]:
            millis, random_part = _last[0], _last[1] + 1
            if random_part >= 36**_RANDOM_CHARS:
                millis, random_part = millis + 1, 0
        else:
            random_part = secrets.randbelow(36**_RANDOM_CHARS // 2)  # room to count up
        _last[:] = [millis, random_part]
    return _base36(millis, _TIME_CHARS) + _base36(random_part, _RANDOM_CHARS)


def default_run_name(kind: str) -> str:
    """A readable name like "train-swift-otter"; the store makes it unique."""
    return f"{kind}-{secrets.choice(_ADJECTIVES)}-{secrets.choice(_NOUNS)}"
