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


def read_json(file: Path):
    return json.loads(Path(file).read_text())


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
               ".json": read_json}
    for file in sorted(Path(path).rglob("*")):
        reader = readers.get(file.suffix)
        if reader and file.is_file():
            try:
                reader(file)
            except Exception as e:  # noqa: BLE001
                return f"{file}: {type(e).__name__}: {e}"
    return None


# Tune's experiment-level state files (name pattern -> reader): which trials exist with which checkpoints, and the
# search algorithm's progress. Tune writes them to the driver's staging directory in the Ray session dir and copies
# them (and each trial's logs) to the storage path in the background, in place: a SIGKILL during a copy leaves the
# stored file empty or cut.
TUNE_STATE_FILES = {"experiment_state-*.json": read_json,
                    "basic-variant-state-*.json": load_pickle}  # a cloudpickle file despite its name
TRIAL_LOGS = ("result.json", "progress.csv")  # one line per reported result, appended


def repair_experiment_state(experiment: Path, ray_sessions: Path) -> list[Path]:
    """Make an interrupted Tune experiment resumable as the same trials. Each of the newest session's state files
    (``TUNE_STATE_FILES``) that does not read is replaced, atomically, by its copy in the staging directory of the
    session that wrote it (``ray_sessions/session_*/artifacts/<timestamp>/<experiment name>/driver_artifacts``),
    when that copy is still on this machine and reads — without it ``Tuner.restore`` reads no trials and starts a
    new one from scratch — and then each trial log (``TRIAL_LOGS``) by the staging copy that goes with that state,
    where it extends the stored one; with the state intact, only a log the kill left in mid-copy (cut inside a
    line, or empty although its trial has a checkpoint) takes its staging copy's lines. A trial log cut inside a
    line loses that line (the resumed trial logs its result again, instead of appending to half a line). Returns
    the files repaired; raises ``CheckpointError`` naming the damaged file and the latest trial checkpoint where no
    intact copy is left."""
    experiment = Path(experiment)
    states = sorted(experiment.glob("experiment_state-*.json"))
    if not states:
        return []
    timestamp = states[-1].name[len("experiment_state-"):-len(".json")]  # Tune restores the newest session's
    repaired, staging = [], None
    for pattern, reader in TUNE_STATE_FILES.items():
        file = experiment / pattern.replace("*", timestamp)
        if not file.exists() or _reads(reader, file):
            continue
        copies = _staging_copies(ray_sessions, timestamp, experiment.name, file.name, reader)
        if not copies:
            checkpoints = sorted(experiment.glob("*/checkpoint_*/" + ALGORITHM_STATE), key=lambda f: f.stat().st_mtime)
            hint = (f"; continue from the latest checkpoint as a new trial with --restore {checkpoints[-1].parent}"
                    if checkpoints else "")
            raise CheckpointError(f"{file} is damaged ({file.stat().st_size} bytes: the run was killed while Tune "
                                  f"was writing it) and no intact copy is left in {ray_sessions}{hint}")
        _write_atomically(file, copies[-1].read_bytes())
        repaired.append(file)
        staging = copies[-1].parent
    state_intact = staging is None
    if state_intact:  # a trial log can still have been in mid-copy (empty or cut) when the kill came
        copies = _staging_copies(ray_sessions, timestamp, experiment.name, states[-1].name, read_json)
        staging = copies[-1].parent if copies else None
    for file in sorted(f for name in TRIAL_LOGS for f in experiment.glob(f"*/{name}")):
        text = file.read_bytes()
        whole = _whole_lines(text)  # the lines the copy finished
        copy = staging / file.parent.name / file.name if staging else None
        # with the stored state intact, a whole log goes with it (the staging one may be ahead of it); only one the
        # kill left cut, or empty although its trial had checkpointed (so it had logged), takes the staging lines
        in_mid_copy = not text.endswith(b"\n") and (text or any(file.parent.glob("checkpoint_*")))
        if copy is not None and copy.is_file() and (in_mid_copy or not state_intact):
            logged = _whole_lines(copy.read_bytes())  # the log that goes with the staging state
            if logged.startswith(whole):
                whole = logged
        if whole != text:
            _write_atomically(file, whole)
            repaired.append(file)
    return repaired


def _staging_copies(ray_sessions: Path, timestamp: str, experiment: str, name: str, reader) -> list[Path]:
    """The copies of a Tune state file in the staging directories of the sessions that wrote it, those that read,
    oldest session first."""
    return [c for c in sorted(Path(ray_sessions).glob(f"session_*/artifacts/{timestamp}/{experiment}/"
                                                      f"driver_artifacts/{name}")) if _reads(reader, c)]


def _whole_lines(data: bytes) -> bytes:
    return data[:data.rfind(b"\n") + 1]


def _write_atomically(file: Path, data: bytes) -> None:
    tmp = file.with_name(f".{file.name}.repair")
    tmp.write_bytes(data)
    tmp.replace(file)


def _reads(reader, file: Path) -> bool:
    try:
        reader(file)
        return True
    except Exception:  # noqa: BLE001 - empty, cut, not JSON / pickle
        return False
