"""Real pretrained models that ship inside pip packages, with the inputs and the decision each application takes.

Nobody here wrote these graphs, which is the point: they carry exporter plumbing, BatchNorm, Clip/HardSigmoid,
Resize, If and LSTM the way users bring them. Nothing is downloaded at run time: a model is found through the
installed distribution's file list (``importlib.metadata``), without importing the package (its own imports
pull in OpenCV or torch). ``./run`` installs the packages with ``--no-deps``.

Each entry says how the application reads the outputs (``decision``), so a check can ask "same recognized text,
same detections, same speech decisions" and not only "close logits".
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import pathlib
from collections.abc import Callable

import numpy as np

Feeds = dict[str, np.ndarray]


@dataclasses.dataclass(frozen=True)
class RealModel:
    name: str
    package: str  # pip distribution that ships the file
    file: str  # path inside the distribution
    feeds: Callable[[np.random.Generator], Feeds]  # realistic inputs at the application's usual size
    decision: Callable[[list[np.ndarray]], np.ndarray]  # what the application concludes from the outputs
    what: str

    def path(self) -> pathlib.Path | None:
        """The installed file, or None when the package (or that file) is not installed."""
        try:
            dist = importlib.metadata.distribution(self.package)
        except importlib.metadata.PackageNotFoundError:
            return None
        path = pathlib.Path(str(dist.locate_file(self.file)))
        return path if path.is_file() else None


# 5x7 bitmap digits (rows top to bottom, "#" = ink): enough real glyphs for a detector to find lines and a
# recognizer to read them, without a font file or an imaging library.
_DIGITS = {
    "0": (".###.", "#...#", "#..##", "#.#.#", "##..#", "#...#", ".###."),
    "1": ("..#..", ".##..", "..#..", "..#..", "..#..", "..#..", ".###."),
    "2": (".###.", "#...#", "....#", "...#.", "..#..", ".#...", "#####"),
    "3": ("####.", "....#", "....#", ".###.", "....#", "....#", "####."),
    "4": ("...#.", "..##.", ".#.#.", "#..#.", "#####", "...#.", "...#."),
    "5": ("#####", "#....", "####.", "....#", "....#", "#...#", ".###."),
    "6": (".###.", "#....", "#....", "####.", "#...#", "#...#", ".###."),
    "7": ("#####", "....#", "...#.", "..#..", ".#...", ".#...", ".#..."),
    "8": (".###.", "#...#", "#...#", ".###.", "#...#", "#...#", ".###."),
    "9": (".###.", "#...#", "#...#", ".####", "....#", "....#", ".###."),
}


def _glyphs(text: str, scale: int) -> np.ndarray:
    """Ink mask of ``text`` (digits and spaces) in the 5x7 font, ``scale`` pixels per font pixel."""
    cells = [np.array([[c == "#" for c in row] for row in _DIGITS[ch]]) if ch != " " else np.zeros((7, 5), bool)
             for ch in text]
    line = np.concatenate([np.pad(c, ((0, 0), (0, 1))) for c in cells], axis=1)
    return np.kron(line, np.ones((scale, scale), bool))


def _text_image(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """Dark digit lines on a light, slightly noisy page, normalized as PaddleOCR's pipelines do
    ((x/255 - 0.5) / 0.5)."""
    scale = max(2, height // 12) if height < 100 else 4
    img = np.full((height, width), 230.0) + rng.normal(0, 3, (height, width))
    y = (height - 7 * scale) // 2 if height < 100 else 2 * scale
    while y + 7 * scale <= height:
        text = "".join(rng.choice(list("0123456789  ")) for _ in range(max(1, (width - 4 * scale) // (6 * scale))))
        ink = _glyphs(text.strip() or "0", scale)[:, : width - 2 * scale]
        img[y:y + ink.shape[0], 2 * scale:2 * scale + ink.shape[1]][ink] = 30.0
        y += 7 * scale * 3 if height >= 100 else height
    chw = np.repeat(np.clip(img, 0, 255)[None], 3, axis=0)
    return ((chw / 255.0 - 0.5) / 0.5).astype(np.float32)[None]


def _speech_chunk(rng: np.random.Generator, samples: int = 512) -> np.ndarray:
    """A voiced-like chunk at 16 kHz: a 140 Hz harmonic series with an envelope, plus noise."""
    t = np.arange(samples) / 16000.0
    voice = sum(np.sin(2 * np.pi * 140 * k * t) / k for k in range(1, 8))
    return (0.3 * voice * np.hanning(samples) + rng.normal(0, 0.01, samples)).astype(np.float32)[None]


def _ctc_greedy(outputs: list[np.ndarray]) -> np.ndarray:
    """PaddleOCR's CTC decode: argmax per time step, repeats collapsed, blank (index 0) dropped."""
    best = outputs[0][0].argmax(-1)
    keep = np.r_[True, best[1:] != best[:-1]] & (best != 0)
    return best[keep]


def _text_mask(outputs: list[np.ndarray]) -> np.ndarray:
    """DBNet post-processing's first step: the probability map thresholded at 0.3."""
    return outputs[0] > 0.3


def _argmax(outputs: list[np.ndarray]) -> np.ndarray:
    return outputs[0].argmax(-1)


def _speech(outputs: list[np.ndarray]) -> np.ndarray:
    """Silero's default: speech when the probability exceeds 0.5."""
    return outputs[0] > 0.5


def _vad_feeds(with_sr: bool) -> Callable[[np.random.Generator], Feeds]:
    def feeds(rng: np.random.Generator) -> Feeds:
        f = {"input": _speech_chunk(rng), "state": np.zeros((2, 1, 128), np.float32)}
        if with_sr:
            f["sr"] = np.array(16000, np.int64)
        return f
    return feeds


_OCR = "rapidocr-onnxruntime"
_VAD = "silero-vad"

CORPUS: tuple[RealModel, ...] = (
    RealModel("ocr-cls", _OCR, "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
              lambda rng: {"x": _text_image(rng, 48, 192)}, _argmax, "text direction classifier, 48x192"),
    RealModel("ocr-rec", _OCR, "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
              lambda rng: {"x": _text_image(rng, 48, 320)}, _ctc_greedy, "PP-OCRv4 text recognizer, 48x320"),
    RealModel("ocr-det", _OCR, "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
              lambda rng: {"x": _text_image(rng, 320, 320)}, _text_mask, "PP-OCRv4 DBNet text detector, 320x320"),
    RealModel("vad", _VAD, "silero_vad/data/silero_vad.onnx", _vad_feeds(True), _speech,
              "Silero VAD v5 (If on the sample rate), 512 samples"),
    RealModel("vad-op15", _VAD, "silero_vad/data/silero_vad_16k_op15.onnx", _vad_feeds(True), _speech,
              "Silero VAD, 16 kHz, opset 15"),
    RealModel("vad-half", _VAD, "silero_vad/data/silero_vad_half.onnx", _vad_feeds(False), _speech,
              "Silero VAD, fp16 weights"),
)


def by_name(name: str) -> RealModel:
    for m in CORPUS:
        if m.name == name:
            return m
    raise KeyError(f"no real model named {name!r}; known: {', '.join(m.name for m in CORPUS)}")
