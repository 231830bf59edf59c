"""Prefix batching: specialised model variants that share a prefix are batched together in the prefix.

Nexus (Shen et al., SOSP'19) §6.3 "Prefix Batching" and epoch step 2 (§6.1): models produced by
transfer learning differ only in their last layer(s); Nexus batches "all but the output layer" across them
and runs "the different suffix parts ... sequentially". Each epoch it combines "two or more models that share a
prefix and latency SLO into a new prefix-batched model", which the squishy packer then places as one session.

Prefixes are *declared* groups (the authors' ``share_prefix`` in ``model_db.yml``), not found by
hashing sub-trees; only sessions with the same SLO are merged. Cost model (inferred): a batch of
``b = Σ_j b_j`` inputs of a group costs ``ℓ_prefix(b) + Σ_{j: b_j>0} ℓ_suffix(b_j)``, where ``b_j`` is variant
j's part of the batch, split in proportion to the variants' rates; memory is one prefix plus one suffix per
variant. Without prefix batching every variant is a whole model ``ℓ_prefix + ℓ_suffix`` with its own memory.

Example: 4 ResNet-50 variants (1 FC suffix) at SLO 100 ms, 300 req/s each →
``merge_sessions(...)`` gives one session ``resnet@100`` at 1200 req/s whose batch of 64 costs
``ℓ_resnet(64) + 4·ℓ_fc(16)``; memory grows by one FC suffix (8 MiB) per added variant instead of ~1 GiB.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from gpu.errors import ConfigError
from gpu.schedulers.nexus.squishy import Session
from gpu.schedulers.nexus.profiles import BatchProfile


@dataclass(frozen=True)
class PrefixGroup:
    """Variant models declared to share one prefix.

    Args:
        name: group name (merged sessions are named ``<name>@<slo>``).
        prefix: profile of the shared prefix, ℓ_prefix(b) and its memory.
        suffix: profile of one variant's unshared suffix (the same shape for every variant).
        models: the variant model names; each is also a standalone model ``prefix + suffix``.
    """

    name: str
    prefix: BatchProfile
    suffix: BatchProfile
    models: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.models:
            raise ConfigError(f"prefix_groups.{self.name}.models", self.models, "need at least one variant model")
        if len(set(self.models)) != len(self.models):
            raise ConfigError(f"prefix_groups.{self.name}.models", self.models, "variant names must be unique")

    @property
    def max_batch(self) -> int:
        return min(self.prefix.max_batch, self.suffix.max_batch)

    def variant_profile(self, model: str) -> BatchProfile:
        """One variant run on its own (no prefix batching): full model = prefix + suffix, own memory."""
        bs = tuple(range(1, self.max_batch + 1))
        mem = tuple(self.prefix.memory(b) + self.suffix.memory(b) for b in bs)
        return BatchProfile(model, bs, tuple(self.prefix.latency(b) + self.suffix.latency(b) for b in bs),
                            memory_bytes=mem if any(mem) else ())

    def merged_profile(self, rates: Sequence[float], model: str | None = None) -> BatchProfile:
        """The profile of one prefix-batched session of variants with these rates (req/s)."""
        w = np.asarray(rates, dtype=float)
        if len(w) == 0 or (w < 0).any() or w.sum() <= 0:
            raise ConfigError(f"prefix_groups.{self.name}.rates", list(rates), "need positive variant rates")
        w = w / w.sum()
        bs = tuple(range(1, self.max_batch + 1))
        lat = tuple(self.prefix.latency(b) + sum(self.suffix.latency(int(k)) for k in _split(b, w) if k > 0)
                    for b in bs)
        mem = tuple(self.prefix.memory(b) + len(w) * self.suffix.memory(b) for b in bs)
        return BatchProfile(model or f"{self.name}×{len(w)}", bs, lat, memory_bytes=mem if any(mem) else ())


def _split(b: int, weights: np.ndarray) -> np.ndarray:
    """Integer parts of ``b`` in proportion to ``weights`` (largest remainder), summing to ``b``."""
    raw = b * weights
    parts = np.floor(raw).astype(int)
    short = b - int(parts.sum())
    if short:
        parts[np.argsort(-(raw - parts), kind="stable")[:short]] += 1
    return parts


def merge_sessions(sessions: Sequence[Session], groups: Sequence[PrefixGroup]
                   ) -> tuple[list[Session], dict[str, BatchProfile]]:
    """Epoch step 2: sessions of one group with the same SLO become one prefix-batched session.

    Returns the new session list (unmerged sessions unchanged, in order; a group's merged session where
    its first member was) and the profiles of the merged models, to add to the profile database.
    A group member alone at its SLO stays a plain session of its variant model.
    """
    owner = {m: g for g in groups for m in g.models}
    buckets: dict[tuple[str, float], list[Session]] = {}
    for s in sessions:
        if s.model in owner and s.rate > 0:
            buckets.setdefault((owner[s.model].name, float(s.slo_ms)), []).append(s)
    by_name = {g.name: g for g in groups}
    out: list[Session] = []
    profiles: dict[str, BatchProfile] = {}
    done: set[tuple[str, float]] = set()
    for s in sessions:
        key = (owner[s.model].name, float(s.slo_ms)) if s.model in owner else None
        if key is None or key not in buckets or len(buckets[key]) < 2:
            out.append(s)
            continue
        if key in done:
            continue
        done.add(key)
        members = buckets[key]
        sid = f"{key[0]}@{key[1]:g}"
        profiles[sid] = by_name[key[0]].merged_profile([m.rate for m in members], sid)
        out.append(Session(sid, sid, key[1], sum(m.rate for m in members)))
    return out, profiles


def variant_profiles(groups: Sequence[PrefixGroup], known: Mapping[str, BatchProfile]) -> dict[str, BatchProfile]:
    """Standalone profiles of every declared variant (ConfigError if a variant name is already a model)."""
    out: dict[str, BatchProfile] = {}
    for g in groups:
        for m in g.models:
            if m in known or m in out:
                raise ConfigError(f"prefix_groups.{g.name}.models", m, "variant name clashes with another model")
            out[m] = g.variant_profile(m)
    return out
