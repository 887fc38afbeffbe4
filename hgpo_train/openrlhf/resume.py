"""Resuming from the DeepSpeed checkpoint in a run folder, on the same shape or another one.

DeepSpeed writes one ZeRO optimizer shard per data-parallel rank and refuses to load them into
another number of ranks (after every actor and engine has started). A resume on another shape
(``openrlhf.num_nodes * gpus_per_node`` changed: a smaller allocation after preemption, or more
GPUs) converts the checkpoint once to DeepSpeed's universal format (``ds_to_universal``, which
OpenRLHF loads with ``--ds.use_universal_ckpt``) and resumes from that.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from hgpo_train.config import ConfigError
from hgpo_train.run import durable

UNIVERSAL_SUFFIX = "_universal"
UNIVERSAL_FLAG = "--ds.use_universal_ckpt"
COMPLETE = "hgpo_complete"
"""Written into a checkpoint's folder once every policy rank has written its part. DeepSpeed's
rank 0 writes ``latest`` when its own part is done, so with several ranks a kill can leave
``latest`` naming a checkpoint whose other shards are cut."""


def latest_tag(actor_dir: Path) -> str | None:
    """DeepSpeed's pointer to the newest checkpoint (e.g. ``global_step3``), None when there is none."""
    latest = actor_dir / "latest"
    tag = latest.read_text().strip() if latest.is_file() else ""
    return tag or None


def complete_tag(actor_dir: Path) -> str | None:
    """The checkpoint to resume from: ``latest``'s, unless several ranks saved it and it lacks the
    :data:`COMPLETE` marker while an older one has it; then that older one, written into
    ``latest`` (atomically) and said on stderr. Folders saved before markers existed are trusted."""
    tag = latest_tag(actor_dir)
    if tag is None or saved_ranks(actor_dir / tag) <= 1 or (actor_dir / tag / COMPLETE).is_file():
        return tag
    marked = [p.name for p in actor_dir.glob("global_step*") if (p / COMPLETE).is_file()]
    if not marked:
        return tag
    newest = max(marked, key=tag_iteration)
    print(
        f"{actor_dir / tag} was cut short (not every policy rank finished writing it): resuming from "
        f"{newest} instead",
        file=sys.stderr,
        flush=True,
    )
    durable.write_text(actor_dir / "latest", newest)
    return newest


def tag_iteration(tag: str) -> int:
    """The iteration a checkpoint tag was saved after: ``global_step3`` and ``global_step3_universal`` -> 3."""
    return int(tag.removeprefix("global_step").removesuffix(UNIVERSAL_SUFFIX))


def saved_ranks(folder: Path) -> int:
    """Data-parallel ranks that wrote this checkpoint (its ZeRO optimizer shards); 0 for a universal one."""
    return len(list(folder.glob("*zero_pp_rank_*_mp_rank_*_optim_states.pt")))


def resume_args(actor_dir: Path, dp_size: int) -> list[str]:
    """OpenRLHF flags to resume the latest checkpoint with ``dp_size`` ranks, converting it first
    when it was saved by another number of ranks. Says on stderr what it resumes from."""
    tag = complete_tag(actor_dir)
    if tag is None:
        return []
    if not any((actor_dir / tag).glob("mp_rank_*_model_states.pt")):
        raise ConfigError(
            f"{actor_dir / 'latest'} names {tag}, which holds no complete checkpoint (deleted, or cut "
            "short by a kill): write an earlier global_stepN folder's name into it, or pass --overwrite"
        )
    ranks = saved_ranks(actor_dir / tag)
    if ranks and ranks != dp_size:
        universal = tag + UNIVERSAL_SUFFIX
        print(
            f"{actor_dir / tag} was saved by {ranks} policy ranks and this run has {dp_size}: converting it "
            f"to DeepSpeed's universal checkpoint ({universal}) to resume on the new shape",
            file=sys.stderr,
            flush=True,
        )
        convert_to_universal(actor_dir / tag, actor_dir / universal)
        for pointer in ("latest", "latest_universal"):  # DeepSpeed reads the second with the universal flag
            (actor_dir / f"{pointer}.tmp").write_text(universal)
            os.replace(actor_dir / f"{pointer}.tmp", actor_dir / pointer)
        tag, ranks = universal, 0
    print(f"resuming from {actor_dir / tag} (iteration {tag_iteration(tag)})", file=sys.stderr, flush=True)
    return [] if ranks else [UNIVERSAL_FLAG]


def convert_to_universal(source: Path, target: Path) -> None:
    """DeepSpeed's own converter, into a temporary folder renamed when complete (a crash leaves no
    half-written checkpoint behind ``latest``; the caller points ``latest_universal``, which the
    converter aims at the temporary name, at the result). Models saved by Hugging Face code carry
    no universal-checkpoint metadata, so the converter adds its default (``--inject_missing_state``)."""
    if target.is_dir():
        return
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    command = [sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal", "--inject_missing_state"]
    command += ["--input_folder", str(source), "--output_folder", str(partial)]
    done = subprocess.run(
        command, capture_output=True, text=True, check=False, env={"DS_ACCELERATOR": "cpu", **os.environ}
    )
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ConfigError(
            f"converting {source} to a universal checkpoint failed ({last}); resume with the shape that "
            f"saved it ({saved_ranks(source)} policy ranks), or run: {' '.join(command)}"
        )
    partial.rename(target)
