"""The MARS paper's reference validation losses (docs/algorithms.md, section 6.3), drawn on loss curves."""

from __future__ import annotations

from typing import Any

# best validation loss on OpenWebText, by optimizer and model size, at 5B / 20B / 50B tokens
PAPER_BEST_VAL: dict[tuple[str, str], tuple[float, float, float]] = {
    ("AdamW", "small"): (3.193, 3.024, 2.885),
    ("AdamW", "medium"): (3.084, 2.821, 2.691),
    ("AdamW", "large"): (3.013, 2.741, 2.561),
    ("Muon", "small"): (3.165, 3.006, 2.901),
    ("Muon", "medium"): (3.009, 2.813, 2.688),
    ("Muon", "large"): (2.915, 2.691, 2.573),
    ("MARS-exact", "small"): (3.107, 2.980, 2.847),
    ("MARS-approx", "small"): (3.108, 2.981, 2.849),
    ("MARS-approx", "medium"): (2.969, 2.763, 2.636),
    ("MARS-approx", "large"): (2.876, 2.647, 2.518),
}
PAPER_TOKENS = (5e9, 20e9, 50e9)


def paper_key(optimizer: str, approx: bool, size: str | None, data: str | None) -> tuple[str, str] | None:
    """The (optimizer, size) entry of PAPER_BEST_VAL a run reproduces, if any (OpenWebText only)."""
    if data != "openwebtext" or size is None:
        return None
    key = {"adamw": "AdamW", "muon": "Muon"}.get(optimizer)
    if optimizer == "mars_adamw":
        key = "MARS-approx" if approx else "MARS-exact"
    return (key, size) if (key, size) in PAPER_BEST_VAL else None


def paper_entry(cfg: dict[str, Any]) -> tuple[str, str] | None:
    """The entry of PAPER_BEST_VAL a run's nested config reproduces, if any: GPT-2 at a paper size
    (its spec's size names), on OpenWebText."""
    from mars.model.spec import DEFAULT_ARCH, arch, arch_names

    opt, model, data = cfg.get("optimizer", {}), cfg.get("model", {}), cfg.get("data", {})
    name = str(model.get("arch") or DEFAULT_ARCH)
    spec = arch(name) if name in arch_names() else None
    size = spec.sizes.get((model.get("n_layer"), model.get("n_head"), model.get("n_embd"))) if spec else None
    size = size if spec is not None and spec.name == "gpt2" else None  # the paper's runs are GPT-2
    return paper_key(str(opt.get("name", "?")), bool(opt.get("approx", True)), size, data.get("name"))
