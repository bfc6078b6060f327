"""Prepare datasets: ``prepare(cfg)`` (the prepare command) and ``ensure_prepared(cfg)`` (the trainer).

The directory layout and the config bookkeeping are in mars.data.layout, the tokenizing shard
writer in mars.data.writer, the document sources in mars.data.sources.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import replace
from pathlib import Path

from mars.data.config import DataConfig
from mars.data.layout import (
    MANIFEST,
    PROGRESS,
    SIZE_KEYS,
    SPLIT_KEYS,
    as_data_config,
    clear,
    config_differences,
    dataset_dir,
    dir_lock,
    identity_keys,
    prepare_command,
    read_json,
    requested_config,
    rewrite_lock,
)
from mars.data.writer import repair_shards, summary, write_shards
from mars.errors import DataError, ManifestError, SourceChangedError
from mars.files import nearest_existing, try_create_dir_in

__all__ = ["check_ready", "dataset_dir", "ensure_prepared", "prepare", "prepare_command"]

log = logging.getLogger(__name__)


def _manifest_matches(path: Path, cfg: DataConfig) -> bool:
    """True when ``path`` holds a finished preparation of exactly ``cfg``'s dataset."""
    manifest = path / MANIFEST
    if not manifest.is_file():
        return False
    recorded = read_json(manifest).get("config", {})
    wanted = requested_config(cfg)
    return not config_differences(recorded, wanted, identity_keys(wanted) + SIZE_KEYS)


def prepared_on_first_use(cfg: DataConfig) -> bool:
    """Whether ``cfg``'s source is a corpus prepared on first use (Source.prepared_on_first_use: embedded)."""
    from mars.data.registry import source_class

    return source_class(cfg.name, cfg.hf_path).prepared_on_first_use


_SHORT = {"val_tokens": "val", "shard_tokens": "shard", "token_budget": "budget"}


def _shared_corpus_error(cfg: DataConfig, out: Path, recorded: dict, wanted: dict) -> ManifestError | None:
    """A refusal when ``out`` holds a corpus prepared on first use (the embedded one) with other settings
    that a config chooses (seed, split sizes): other runs use that directory, so a run does not rewrite it.
    What the installation decides (its Python version: Source.environment_keys) is not chosen: when it
    changed, the corpus is rebuilt."""
    from mars.data.registry import source_class

    derived = source_class(cfg.name, cfg.hf_path).environment_keys
    chosen = [k for k in (*identity_keys(wanted), *SIZE_KEYS) if k not in derived]
    keys = [k for k in chosen if recorded.get(k) != wanted.get(k)]
    if not keys:
        return None
    prepared = ", ".join(f"data.{k}={recorded.get(k)}" for k in keys)
    asked = ", ".join(f"data.{k}={wanted.get(k)}" for k in keys)
    own = f"{cfg.name}_" + "_".join(f"{_SHORT.get(k, k)}{wanted.get(k)}" for k in keys)
    return ManifestError(
        f"{out} holds a preparation with {prepared}, not {asked}; other runs use it, so it is "
        f"not rewritten: pass {prepared}, or give this split a directory of its own with data.dir={own} "
        "(prepared on first use)"
    )


def split_note(out: Path, cfg: DataConfig, recorded: dict, *, refused: bool = False) -> str:
    """``out``, prepared as ``recorded`` (its manifest's config), has another validation split than ``cfg``
    asks for: which one, how to use it as it is, and the one command that prepares it again with
    ``cfg``'s split (``resplit=true``)."""
    seed = recorded.get("split_seed")
    if seed is None:
        what = (
            f"{out} was split by the old rule: its validation split is the first "
            f"{recorded.get('val_tokens', cfg.val_tokens):,} tokens of the document stream, the first "
            "files' documents when the files are ordered by source (data.split_seed=null)"
        )
    else:
        what = f"{out} was prepared with data.split_seed={seed}, another sample of documents for validation"
    value = "null" if seed is None else seed
    use = (
        f"pass data.split_seed={value} to use it"
        if refused
        else f"training uses it as it is (data.split_seed={value} does so without this note)"
    )
    return (
        f"{what}; {use}. To sample the split with data.split_seed={cfg.split_seed} instead, prepare it "
        f"again (all of it is tokenized): {prepare_command(cfg)} resplit=true"
    )


def _settle_split(cfg: DataConfig, out: Path, resplit: bool) -> tuple[DataConfig, str]:
    """``cfg`` as far as ``out``'s validation split goes, and a note to print at the end.

    A directory prepared, or being prepared, with the head rule (a recorded split_seed of null: every
    dataset prepared before the sample rule) keeps it, named in the note. With ``resplit``, a directory
    holding the same documents and sizes under another split has its shards removed first (mars.data.
    layout.clear), so that it is prepared anew with ``cfg``'s; one with other documents or sizes is left
    to the refusal that follows.
    """
    path = out / MANIFEST if (out / MANIFEST).is_file() else out / PROGRESS
    wanted = requested_config(cfg)
    if not path.is_file() or "split_seed" not in wanted:
        return cfg, ""
    recorded = read_json(path).get("config", {})
    prepared = recorded.get("split_seed")
    if prepared == cfg.split_seed:
        return cfg, ""
    if resplit:
        if not config_differences(recorded, wanted, identity_keys(wanted) + SIZE_KEYS):
            was = "null" if prepared is None else prepared
            print(f"re-splitting {out}: removing its shards (data.split_seed={was})", flush=True)
            clear(out)
        return cfg, ""
    if prepared is None:
        return replace(cfg, split_seed=None), split_note(out, cfg, recorded)
    return cfg, ""


def _os_error(e: OSError, out: Path) -> DataError:
    where = f"the dataset directory {out} (data.root, data.dir)"
    return DataError(f"{e}; fix that path (free space, permissions) or choose another data.root ({where})")


def prepare(cfg: DataConfig, *, progress_bar: bool = True, resplit: bool = False) -> Path:
    """Prepare ``cfg``'s dataset, resuming an interrupted run or repairing a finished one; return its dir.

    A directory that already holds this dataset has every shard checked (sizes; sha256 unless
    ``.verified.json`` vouches for the file) and any missing or damaged one rebuilt from the source,
    one line printed per repaired shard. One that holds a different dataset raises ManifestError; the
    embedded corpus is rebuilt only when the Python install it is derived from changed (or it cannot be
    repaired in place), never for another seed or split, which is refused naming data.dir for a
    directory of its own ("the embedded corpus": any source whose class is ``prepared_on_first_use``). A
    directory that cannot be written raises DataError naming data.root.

    A directory whose validation split is not the one ``cfg`` asks for (data.split_seed) is refused, but
    one split by the head rule (every dataset prepared before the sample rule) is used as it is and
    named; ``resplit=True`` prepares either of them again with ``cfg``'s split (``_settle_split``).
    """
    cfg = as_data_config(cfg)
    out = dataset_dir(cfg)
    if resplit and prepared_on_first_use(cfg):
        raise DataError(
            f"resplit=true: the {cfg.name} corpus is never split again (its documents are shuffled, then "
            "the first data.val_tokens tokens held out, the same for every run that shares it): drop "
            "resplit=true"
        )
    try:
        if resplit and (out / MANIFEST).is_file():
            with rewrite_lock(out):  # not under a live run that reads it
                return _prepare(cfg, out, progress_bar, resplit)
        return _prepare(cfg, out, progress_bar, resplit)
    except OSError as e:
        raise _os_error(e, out) from e


def _prepare(cfg: DataConfig, out: Path, progress_bar: bool, resplit: bool) -> Path:
    from mars.data.registry import get_source

    first_use = prepared_on_first_use(cfg)
    sizes = dict(val_tokens=cfg.val_tokens, shard_tokens=cfg.shard_tokens, token_budget=cfg.token_budget)
    with dir_lock(out):
        cfg, note = (cfg, "") if first_use else _settle_split(cfg, out, resplit)
        wanted = requested_config(cfg)
        keys = identity_keys(wanted) + SIZE_KEYS + SPLIT_KEYS
        hint = (
            f"restore the source files as they were, or delete {out} and run `{prepare_command(cfg)}` "
            f"to prepare it from the current ones"
        )
        manifest = out / MANIFEST
        if manifest.is_file():
            recorded = read_json(manifest).get("config", {})
            diffs = config_differences(recorded, wanted, keys)
            if diffs and not first_use:
                if not config_differences(recorded, wanted, identity_keys(wanted) + SIZE_KEYS):
                    raise ManifestError(split_note(out, cfg, recorded, refused=True))
                raise ManifestError(
                    f"{manifest}: {out} already holds a different preparation ({'; '.join(diffs)}). "
                    f"Delete {out} or choose another data.dir."
                )
            if diffs:
                refusal = _shared_corpus_error(cfg, out, recorded, wanted)
                if refusal is not None:
                    raise refusal
            if not diffs:
                # a rebuilt shard must skip the documents its preparation skipped, whatever cfg says
                skip = cfg.skip_bad_documents or bool(recorded.get("skip_bad_documents"))
                try:
                    repaired = repair_shards(
                        lambda: get_source(replace(cfg, skip_bad_documents=skip)),
                        out,
                        **sizes,
                        workers=cfg.num_workers,
                        progress_bar=progress_bar,
                        hint=hint,
                    )
                except (SourceChangedError, ManifestError) as e:
                    if not first_use:
                        raise
                    log.warning("%s; rebuilding the %s corpus", e, cfg.name)
                    clear(out)
                else:
                    done = f"{len(repaired)} shard(s) repaired" if repaired else "already prepared"
                    print(f"{summary(out, read_json(manifest))} ({done})", flush=True)
                    if note:
                        print(f"note: {note}", flush=True)
                    return out
        if first_use:
            progress = out / PROGRESS
            stale = manifest.is_file() or (
                progress.is_file() and config_differences(read_json(progress).get("config", {}), wanted, keys)
            )
            if stale:  # another Python install's corpus, or an interrupted preparation of other settings
                log.info("rebuilding the %s corpus in %s for %s", cfg.name, out, wanted)
                clear(out)
        source = get_source(cfg)
        try:
            write_shards(
                source, out, wanted, **sizes, workers=cfg.num_workers, progress_bar=progress_bar, hint=hint
            )
        except SourceChangedError as e:
            if not first_use:
                raise
            # the Python install changed under an interrupted preparation: start over from this one
            log.warning("%s; rebuilding the %s corpus", e, cfg.name)
            clear(out)
            write_shards(
                get_source(cfg), out, wanted, **sizes, workers=cfg.num_workers, progress_bar=progress_bar
            )
        if note:
            print(f"note: {note}", flush=True)
    return out


def check_ready(cfg: DataConfig) -> None:
    """Raise what ``ensure_prepared(cfg)`` would raise before it writes anything, without writing: the
    trainer calls it before Hydra creates the run dir. The embedded corpus, when it still has to be
    prepared, needs a directory that can be written."""
    cfg = as_data_config(cfg)
    if not prepared_on_first_use(cfg):
        ensure_prepared(cfg)  # reads only
        return
    out = dataset_dir(cfg)
    if _manifest_matches(out, cfg):
        return
    if (out / MANIFEST).is_file():
        refusal = _shared_corpus_error(
            cfg, out, read_json(out / MANIFEST).get("config", {}), requested_config(cfg)
        )
        if refusal is not None:
            raise refusal
    base = nearest_existing(out)
    try:
        try_create_dir_in(base)
    except OSError as e:
        raise DataError(
            f"data.root={cfg.root}: the {cfg.name} corpus is prepared on first use into {out}, but "
            f"{base} cannot be written ({e.strerror or e}); choose a writable data.root, or prepare it "
            "once where it can be written and point data.root there"
        ) from None


def ensure_prepared(cfg: DataConfig) -> Path:
    """The dataset directory of ``cfg``, prepared.

    The embedded corpus (a source ``prepared_on_first_use``) is prepared on first use. Any other source
    raises DataError
    holding the exact prepare command; a directory prepared with other settings raises ManifestError
    (different documents) or warns (different sizes: the prepared split is used).
    """
    cfg = as_data_config(cfg)
    out = dataset_dir(cfg)
    if prepared_on_first_use(cfg):
        return out if _manifest_matches(out, cfg) else prepare(cfg)
    manifest = out / MANIFEST
    if not manifest.is_file():
        partial = (
            " (an interrupted preparation is there: the command resumes it)"
            if (out / PROGRESS).is_file()
            else ""
        )
        if cfg.name == "local" and not cfg.paths:  # the command would stop there: say what it needs
            command = prepare_command(cfg, paths=("FILES",)).replace("[FILES]", "[FILES...]")
            raise DataError(
                f"{out} holds no prepared dataset ({manifest} is missing), and data.paths is empty: name "
                f"your files and prepare them with:\n    {command}"
            )
        raise DataError(
            f"{out} holds no prepared dataset: {manifest} is missing{partial}. Prepare it with:\n"
            f"    {prepare_command(cfg)}"
        )
    recorded = read_json(manifest).get("config", {})
    wanted = requested_config(cfg)
    diffs = config_differences(recorded, wanted, identity_keys(wanted))
    if diffs:
        raise ManifestError(
            f"{manifest}: {out} was prepared from other documents than the config asks for "
            f"({'; '.join(diffs)}). "
            f"Pass the settings it was prepared with, or prepare into another directory: "
            f"{prepare_command(cfg, dir='NEW_NAME')}"
        )
    sizes = config_differences(recorded, wanted, SIZE_KEYS)
    if sizes:
        warnings.warn(
            f"{out} was prepared with other sizes ({'; '.join(sizes)}); using it as prepared", stacklevel=2
        )
    if config_differences(recorded, wanted, SPLIT_KEYS):
        # logged (train.log has it, not only stderr), once per process and dataset: the trainer asks for
        # the dataset three times while it starts
        note = split_note(out, cfg, recorded)
        if note not in _said:
            _said.add(note)
            log.warning(note)
    return out


_said: set[str] = set()  # split notes logged by this process
