"""What `show` shows of one rank, and the other words a user may type for each: the one table that
World.show (partui.world.world), the app's `:show` grammar and its shard map read. Plain data, light to
import (the app's first frame loads no torch)."""
from __future__ import annotations

TABLES = ("params", "grad", "optim")          # World.show's tables, an inspector tab each
APP_KINDS = TABLES + ("shards", "trace")      # the app's inspector tabs, what `:show` can open
# each table's list as the shard map reads it (a rank's snapshot; "grads": shard_map.grad_snaps)
LIST_NAMES = {"params": "params", "grad": "grads", "optim": "optimizer"}
# another word for a kind: the singular, and each list's own name (grads -> grad)
ALIASES = {"param": "params", "shard": "shards",
           **{name: kind for kind, name in LIST_NAMES.items() if name != kind}}


def show_kind(word: str) -> str:
    """The kind a word names: an alias's kind (grads -> grad, optimizer -> optim), else the word."""
    return ALIASES.get(word, word)
