"""Drifting "video" streams built from scikit-learn's digits (1797 8x8 images, bundled offline).

Ekya's streams (thesis §2.2) drift: the class mix changes, objects look different (lighting,
camera angle, noise) and new classes appear, so a small model trained on old frames loses
accuracy and must be retrained. Here every stream is a seeded sequence of digit "frames":

- streams drift at different speeds (``drift``; the paper's Table 2.1 has one stream gaining 5%
  from retraining and one 35%): ``make_streams`` spreads ``drift`` evenly from a nearly static
  camera to a fast-changing one, so the value of retraining differs between streams;
- class mix: a Dirichlet draw per window over the classes seen so far (the faster the drift, the
  more the mix moves); each stream starts with ``initial_classes`` digits and
  ``classes_per_window`` new digits appear in every window;
- appearance: rotation (degrees, growing by ``rotation_step`` per window in a per-stream
  direction), Gaussian pixel noise (growing) and brightness (a per-window factor), all scaled by
  ``drift``;
- temporal persistence: an object stays in view for a run of frames (geometric run length, mean
  ``persistence``), so a stale prediction is often still right - what makes frame sub-sampling
  cost less than its rate (``inference_profile_points``).
- objects per frame: a busy camera (``objects_per_frame`` = k) gives every labelled frame k training
  samples (the frame and k - 1 jittered views of it, ``training_views``), so its retraining does k times
  the torch work per epoch for the same configuration; inference still answers once per frame.

Window ``-1`` is the stream's history (no drift) that the deployed model was first trained on.
Everything is a pure function of ``(spec, window, part)``; no torch here.

    >>> spec = make_streams(2, seed=0)[0]
    >>> x, y = window_frames(spec, window=0, n=5, part="live")
    >>> x.shape, x.dtype, y.shape
    ((5, 64), dtype('float32'), (5,))
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from scipy.ndimage import rotate

from gpu.errors import ConfigError

N_CLASSES = 10
PARTS = ("live", "train", "history")  # live frames (inference), frames the golden model labels, history


@lru_cache(maxsize=1)
def _digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    return (x / 16.0).astype(np.float32).reshape(-1, 8, 8), y.astype(np.int64)


@dataclass(frozen=True)
class StreamSpec:
    """One camera's drift: which digits it sees first, in which order new ones appear, how it drifts."""

    name: str
    seed: int
    initial_classes: tuple[int, ...]
    new_classes: tuple[int, ...]  # appear one per window, in this order
    rotation_step: float  # degrees added per window (sign = direction)
    noise_step: float  # pixel noise std added per window (pixels in [0, 1])
    brightness: tuple[float, ...]  # brightness factor per window (cycled)
    persistence: float = 2.5  # mean frames an object stays in view
    drift: float = 1.0  # how fast the stream changes (0: static camera); scales the class-mix churn
    classes_per_window: int = 1  # new digits appearing per window
    objects_per_frame: int = 1  # training samples each labelled frame yields (a busy camera has more)

    def __post_init__(self) -> None:
        if not self.initial_classes:
            raise ConfigError(f"{self.name}.initial_classes", self.initial_classes, "needs at least one class")
        if self.persistence < 1:
            raise ConfigError(f"{self.name}.persistence", self.persistence, "must be >= 1 frame")
        if not self.drift >= 0:
            raise ConfigError(f"{self.name}.drift", self.drift, "must be >= 0")
        if isinstance(self.classes_per_window, bool) or not isinstance(self.classes_per_window, int) \
                or self.classes_per_window < 0:
            raise ConfigError(f"{self.name}.classes_per_window", self.classes_per_window, "must be a whole number >= 0")
        if isinstance(self.objects_per_frame, bool) or not isinstance(self.objects_per_frame, int) \
                or self.objects_per_frame < 1:
            raise ConfigError(f"{self.name}.objects_per_frame", self.objects_per_frame, "must be a whole number >= 1")


@dataclass(frozen=True)
class Conditions:
    """What a stream looks like in one window."""

    class_weights: tuple[float, ...]  # length N_CLASSES, sums to 1
    rotation: float
    noise: float
    brightness: float


def make_streams(n: int, seed: int = 0, drift: tuple[float, float] = (0.05, 1.5)) -> tuple[StreamSpec, ...]:
    """``n`` streams with different drift, reproducible from ``seed``.

    Drift speeds are spread evenly over ``drift`` (low, high) and handed to the streams in a
    seeded order; rotation, noise and brightness changes scale with a stream's speed and it sees
    ``round(speed)`` new digits per window.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
        raise ConfigError("streams", n, "must be a whole number > 0")
    if len(drift) != 2 or not 0 <= drift[0] <= drift[1]:
        raise ConfigError("drift", drift, "must be (low, high) with 0 <= low <= high")
    rng = np.random.default_rng(seed)
    speeds = rng.permutation(np.linspace(drift[0], drift[1], n) if n > 1 else np.array([drift[1]]))
    specs = []
    for i in range(n):
        order = rng.permutation(N_CLASSES)
        d = float(speeds[i])
        specs.append(StreamSpec(
            name=f"cam{i}", seed=int(rng.integers(2**31)), initial_classes=tuple(int(c) for c in sorted(order[:5])),
            new_classes=tuple(int(c) for c in order[5:]),
            rotation_step=float(rng.choice([-1, 1]) * d * rng.uniform(8, 12)),
            noise_step=float(d * rng.uniform(0.02, 0.04)),
            brightness=tuple(float(b) for b in 1.0 + d * rng.uniform(-0.25, 0.25, size=4)),
            drift=d, classes_per_window=int(round(d))))
    return tuple(specs)


def _rng(spec: StreamSpec, window: int, part: str) -> np.random.Generator:
    return np.random.default_rng([spec.seed, window + 1, zlib.crc32(part.encode())])


def conditions(spec: StreamSpec, window: int) -> Conditions:
    """The stream's class mix and appearance in ``window`` (-1: the undrifted history)."""
    if window < -1:
        raise ConfigError("window", window, "must be >= -1")
    seen = list(spec.initial_classes) + list(spec.new_classes[:spec.classes_per_window * max(0, window + 1)])
    weights = np.zeros(N_CLASSES)
    if window < 0:
        weights[seen] = 1.0
        return Conditions(tuple(float(w) for w in weights / weights.sum()), 0.0, 0.0, 1.0)
    # Concentration falls with the drift speed: a static camera keeps its mix, a fast one churns.
    weights[seen] = _rng(spec, window, "mix").dirichlet(np.full(len(seen), 2.0 / max(spec.drift, 0.1)))
    newest = spec.new_classes[spec.classes_per_window * window:spec.classes_per_window * (window + 1)]
    for c in newest:  # the newest classes are clearly present
        weights[c] = max(weights[c], 1.5 / len(seen))
    return Conditions(tuple(float(w) for w in weights / weights.sum()), spec.rotation_step * (window + 1),
                      spec.noise_step * (window + 1), spec.brightness[window % len(spec.brightness)])


def transform(images: np.ndarray, rotation: float, noise: float, brightness: float,
              rng: np.random.Generator) -> np.ndarray:
    """Rotate (±3 degrees of jitter per frame), scale brightness, add noise; returns (n, 64) in [0, 1]."""
    out = np.empty_like(images)
    for k, img in enumerate(images):
        angle = rotation + rng.uniform(-3, 3)
        out[k] = rotate(img, angle, reshape=False, order=1, mode="constant") if angle else img
    out = out * brightness + rng.normal(0.0, noise, out.shape) if noise else out * brightness
    return np.clip(out, 0.0, 1.0).reshape(len(images), -1).astype(np.float32)


def class_sequence(weights: np.ndarray, n: int, persistence: float, rng: np.random.Generator) -> np.ndarray:
    """``n`` frame labels: runs of one class, run lengths geometric with mean ``persistence``."""
    labels = np.empty(n, dtype=np.int64)
    k = 0
    while k < n:
        run = int(rng.geometric(1.0 / persistence))
        labels[k:k + run] = rng.choice(N_CLASSES, p=weights)
        k += run
    return labels


def window_frames(spec: StreamSpec, window: int, n: int, part: str = "live") -> tuple[np.ndarray, np.ndarray]:
    """``n`` frames of ``window`` as (pixels (n, 64) float32, true labels (n,)); ``part`` picks an
    independent draw: "live" (what inference sees, in order), "train" (the pool the golden model
    labels for retraining) or "history" (window -1 data the first model is trained on)."""
    if part not in PARTS:
        raise ConfigError("part", part, f"choose one of {PARTS}")
    if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
        raise ConfigError("n", n, "must be a whole number > 0")
    images, targets = _digits()
    cond = conditions(spec, window)
    rng = _rng(spec, window, part)
    labels = class_sequence(np.asarray(cond.class_weights), n, spec.persistence, rng)
    by_class = [np.flatnonzero(targets == c) for c in range(N_CLASSES)]
    picks = np.array([rng.choice(by_class[c]) for c in labels])
    return transform(images[picks], cond.rotation, cond.noise, cond.brightness, rng), labels


def training_views(spec: StreamSpec, x: np.ndarray, y: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The training samples ``spec``'s labelled frames ``x`` (labels ``y``) yield: each frame, then
    ``objects_per_frame - 1`` views of it with 0.05 pixel noise (seeded), frame by frame."""
    k = spec.objects_per_frame
    if k == 1:
        return x, y
    views = np.repeat(x, k, axis=0)
    jitter = np.random.default_rng([spec.seed, seed, k]).normal(0.0, 0.05, views.shape).astype(np.float32)
    jitter[::k] = 0.0  # the frame itself first
    return np.clip(views + jitter, 0.0, 1.0), np.repeat(y, k)


def augmented_digits(n: int, seed: int, max_rotation: float = 60.0, max_noise: float = 0.35) -> tuple[np.ndarray, np.ndarray]:
    """All digits under random drift of the kinds the streams show (the golden model's training set)."""
    images, targets = _digits()
    rng = np.random.default_rng(seed)
    picks = rng.integers(len(images), size=n)
    out = np.empty((n, 64), dtype=np.float32)
    for k, i in enumerate(picks):
        out[k] = transform(images[i:i + 1], rng.uniform(-max_rotation, max_rotation), rng.uniform(0, max_noise),
                           rng.uniform(0.5, 1.4), rng)[0]
    return out, targets[picks]


def processed_mask(n: int, rate: float) -> np.ndarray:
    """Which of ``n`` consecutive frames an inference job keeping up at ``rate`` processes.

    Frames are sub-sampled evenly; the first frame of a segment is always processed when
    ``rate > 0`` and none are at rate 0.
    """
    if rate <= 0:
        return np.zeros(n, dtype=bool)
    k = np.arange(n)
    return np.floor(k * min(rate, 1.0) + 1e-9) != np.floor((k - 1) * min(rate, 1.0) + 1e-9)


def serve(predictions: np.ndarray, processed: np.ndarray) -> np.ndarray:
    """Answer every frame with the newest processed frame's prediction (-1 before the first one)."""
    idx = np.where(processed, np.arange(len(processed)), -1)
    last = np.maximum.accumulate(idx) if len(idx) else idx
    return np.where(last >= 0, predictions[np.maximum(last, 0)], -1)


def inference_profile_points(persistence: float, rates: np.ndarray | None = None, n: int = 20000,
                             seed: int = 0) -> tuple[tuple[float, float], ...]:
    """Relative accuracy of a perfect model served at each frame rate (Ekya's inference profile).

    Computed offline on a long label sequence with the streams' persistence: the share of frames
    whose served (possibly stale) label is right. Non-decreasing, (0, 0) to (1, 1).
    """
    rates = np.linspace(0.0, 1.0, 11) if rates is None else np.asarray(rates, dtype=float)
    labels = class_sequence(np.full(N_CLASSES, 1.0 / N_CLASSES), n, persistence, np.random.default_rng(seed))
    rel = [float(np.mean(serve(labels, processed_mask(n, r)) == labels)) for r in rates]
    rel = np.maximum.accumulate(np.clip(rel, 0.0, 1.0))
    rel[0], rel[-1] = 0.0, 1.0
    return tuple((float(r), float(q)) for r, q in zip(rates, rel))
