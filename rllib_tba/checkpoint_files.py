"""Reading RLlib checkpoint directories with errors that name the directory or the damaged file."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

ALGORITHM_STATE = "algorithm_state.pkl"  # Algorithm.STATE_FILE_NAME + ".pkl"


class CheckpointError(ValueError):
    """A checkpoint directory that is missing, incomplete or damaged."""


def load_pickle(file: Path):
    """``pickle.load`` of a checkpoint file; a truncated or overwritten file raises ``CheckpointError`` naming it."""
    try:
        with open(file, "rb") as f:
            return pickle.load(f)
    except Exception as e:  # noqa: BLE001 - UnpicklingError, EOFError, ...: name the file
        raise CheckpointError(f"damaged checkpoint file {file}: {type(e).__name__}: {e}") from e


def read_checkpoint_state(path: Path) -> dict:
    """The algorithm's own state file of checkpoint ``path``."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"checkpoint {path} does not exist (or is not a directory)")
    file = path / ALGORITHM_STATE
    if not file.is_file():
        raise CheckpointError(f"{path} is not an RLlib algorithm checkpoint: {ALGORITHM_STATE} is missing")
    return load_pickle(file)


def find_damaged_checkpoint_file(path: Path) -> str | None:
    """The first file under ``path`` that its format's reader rejects, as "file: error" (None if all read)."""
    import torch

    readers = {".pkl": load_pickle, ".pt": lambda f: torch.load(f, weights_only=False),
               ".json": lambda f: json.loads(f.read_text())}
    for file in sorted(Path(path).rglob("*")):
        reader = readers.get(file.suffix)
        if reader and file.is_file():
            try:
                reader(file)
            except Exception as e:  # noqa: BLE001
                return f"{file}: {type(e).__name__}: {e}"
    return None
