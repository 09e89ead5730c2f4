"""Output paths proven before any work: a file a command will write at its end (a trace, a marked
copy, a plot) is refused at once when its folder is missing or unwritable, when it names a folder,
or when its name would be changed on the way, each refusal naming the flag and a fix."""
from __future__ import annotations

import os
import tempfile


def prove_writable(folder: str, flag: str, example: str, create: bool = False) -> None:
    """A probe file written and removed in `folder` (made first when `create`): a real write, not
    os.access, which root passes where a read-only mount refuses. ValueError naming flag and fix."""
    try:
        if create:
            os.makedirs(folder, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".partui-probe-"):
            pass
    except OSError as e:
        raise ValueError(f"{flag}: folder {folder} cannot be written ({e.strerror or e}); pick a "
                         f"folder you can write, e.g. {example}")


def check_output_file(path: str, flag: str, suffixes: tuple[str, ...], example: str) -> None:
    """Refuse, before anything runs, a file path the end of the command could not write as named."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise ValueError(f"{flag} {path} is a folder: name a file in it, e.g. "
                         f"{flag} {os.path.join(path, os.path.basename(example))}")
    if not os.path.isdir(folder):
        raise ValueError(f"{flag} {path}: folder {folder} does not exist; create it or pick another path")
    if not path.endswith(suffixes):
        raise ValueError(f"{flag} {path}: name it {' or '.join(suffixes)}, e.g. {flag} {example}")
    prove_writable(folder, f"{flag} {path}", f"{flag} {example}")
