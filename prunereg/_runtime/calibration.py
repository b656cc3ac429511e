"""Calibration and evaluation inputs turned into token ids, reading and tokenising no more text than is used.

``prunereg.oneshot``, ``prunereg.oneshot_folder`` and ``prunereg oneshot`` all
come through here, so a text is cut into samples the same way everywhere:

- token ids: a ``[n_samples, seq_len]`` tensor or an iterable of batches, used
  as they are (a 1-D tensor is refused: one sample or many is the caller's call);
- a text, a list (or any iterable) of texts, or a ``datasets.Dataset`` with a
  ``text`` column: tokenised one text after the other (each as
  ``tokenizer(text)`` would, special tokens included), and the first
  ``num_samples x seq_len`` tokens cut into ``[num_samples, seq_len]``
  (default 64 x 256, the command line's);
- a tokenizer's output (a ``BatchEncoding`` or a dict with ``input_ids`` and
  optionally ``attention_mask``; also a dataset with an ``input_ids`` column):
  padding is left out; rows of one length are the samples as they are, or
  with ``num_samples``/``seq_len`` they are joined and cut like a text.

A text is tokenised by prefixes that double in length until they hold
:data:`MARGIN` tokens more than are used: truncating a text changes at most the
tokens of its last word, so the ids kept are those of the whole text (the
benchmark's perplexities depend on that), while a 20 MB text used for 64 x 256
tokens is read and tokenised only as far as about twice what is used. A text
used whole (``--eval`` without ``--eval-tokens``) is tokenised :data:`WINDOW`
characters at a time (:func:`all_token_ids`), into the same ids. Files are
read only if regular (a FIFO or ``/dev/zero`` is refused unread) and only as far
as needed. Token ids the model cannot embed and samples longer than it takes are
refused by :func:`check_fits_model` before any pruning.
"""

from __future__ import annotations

import io
import itertools
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from prunereg._disk.errors import CheckpointError
from prunereg._disk.input_file import open_regular
from prunereg._text import quoted

#: The command line's defaults, also those of ``prunereg.oneshot`` for texts.
DEFAULT_SAMPLES = 64
DEFAULT_SEQ_LEN = 256
#: Tokens tokenised beyond those kept, so that the end of a prefix cannot change them.
MARGIN = 64
#: The first prefix has this many characters per token wanted (and at least _FIRST_CHARS).
_CHARS_PER_TOKEN = 6
_FIRST_CHARS = 4096
#: A whole text longer than this many characters is tokenised a window at a time.
WINDOW = 1 << 18

#: How errors spell the sample count and length: in Python, and on the command line.
PYTHON_SPELLING = ("num_samples={}", "seq_len={}")
CLI_SPELLING = ("--samples {}", "--seq-len {}")


class _Text(Protocol):
    def prefix(self, n_chars: int) -> str: ...

    def ends_within(self, n_chars: int) -> bool: ...


class _InMemory:
    """A text already in memory."""

    def __init__(self, text: str) -> None:
        self.text = text

    def prefix(self, n_chars: int) -> str:
        return self.text[:n_chars]

    def ends_within(self, n_chars: int) -> bool:
        return len(self.text) <= n_chars


class TextFile:
    """A UTF-8 text file read from its start no further than asked (universal newlines, as ``read_text``).

    Only a regular file is opened: a FIFO, a socket or a device is refused with
    ``OSError`` before a byte is read.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        try:
            binary = open_regular(self.path, "text file")
        except CheckpointError as error:
            raise OSError(str(error)) from None
        self._handle = io.TextIOWrapper(binary, encoding="utf-8", newline=None)
        self._text = ""
        self._ended = False

    @property
    def chars_read(self) -> int:
        """How many characters have been read from the file so far."""
        return len(self._text)

    def prefix(self, n_chars: int) -> str:
        while len(self._text) < n_chars and not self._ended:
            self._read(max(1 << 16, n_chars - len(self._text)))
        return self._text[:n_chars]

    def ends_within(self, n_chars: int) -> bool:
        self.prefix(n_chars + 1)
        return self._ended and len(self._text) <= n_chars

    def whole(self) -> str:
        while not self._ended:
            self._read(-1)  # the rest at once: one copy, not one per chunk
        return self._text

    def close(self) -> None:
        self._handle.close()

    def __enter__(self) -> TextFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _read(self, n_chars: int) -> None:
        """Read ``n_chars`` more characters (-1: all the rest)."""
        try:
            chunk = self._handle.read(n_chars)
        except UnicodeDecodeError as error:
            byte = error.object[error.start : error.start + 1].hex()
            raise ValueError(
                f"{quoted(self.path)} is not UTF-8 text ({error.reason}: byte 0x{byte}); save it as UTF-8"
            ) from None
        self._text += chunk
        self._ended = not chunk or n_chars < 0


def first_token_ids(tokenizer: Any, text: str | TextFile, limit: int, *, add_special_tokens: bool = True) -> list[int]:
    """The first ``limit`` ids of ``tokenizer(text)``, tokenising prefixes.

    Each prefix doubles the last until it holds ``limit + MARGIN`` tokens or
    the whole text; the ids returned are those of the whole text's tokenisation.
    """
    source: _Text = _InMemory(text) if isinstance(text, str) else text
    n_chars = max(_FIRST_CHARS, (limit + MARGIN) * _CHARS_PER_TOKEN)
    while True:
        prefix = source.prefix(n_chars)
        ids = _encode(tokenizer, prefix, add_special_tokens)
        if len(ids) >= limit + MARGIN or source.ends_within(len(prefix)):
            return ids[:limit]
        n_chars *= 2


def text_file_ids(
    tokenizer: Any, path: str | os.PathLike[str], limit: int | None, *, add_special_tokens: bool = True
) -> Tensor:
    """The first ``limit`` token ids (all if None) of the text file at ``path``, as a 1-D LongTensor."""
    with TextFile(path) as text:
        if limit is None:
            return all_token_ids(tokenizer, text.whole(), add_special_tokens=add_special_tokens)
        return _tensor(first_token_ids(tokenizer, text, limit, add_special_tokens=add_special_tokens))


def all_token_ids(tokenizer: Any, text: str, *, add_special_tokens: bool = True, window: int = WINDOW) -> Tensor:
    """``tokenizer(text)``'s ids as a 1-D LongTensor, a text longer than ``window`` characters a window at a time.

    A fast tokenizer's own memory for a whole text is about 150 times the text
    (3.1 GB for 20 MB); a window bounds it (0.2 GB). Each window after the first
    starts a little before where the last one's ids were cut (at a token
    boundary :data:`MARGIN` tokens before its end), so its first tokens, which
    may differ from the whole text's, are dropped; the seams are checked (a
    token boundary at the cut, the same ids after it in both windows), and the
    whole text is tokenised at once if a check fails or the tokenizer gives no
    offsets (a slow one).
    """
    if len(text) <= window or not getattr(tokenizer, "is_fast", False):
        return _tensor(_encode(tokenizer, text, add_special_tokens))
    specials = _special_tokens(tokenizer, text[:1000], add_special_tokens)
    windowed = _windowed_ids(tokenizer, text, window) if specials is not None else None
    if specials is None or windowed is None:
        return _tensor(_encode(tokenizer, text, add_special_tokens))
    return torch.cat([_tensor(specials[0]), *windowed, _tensor(specials[1])])


def samples_from_text_file(
    tokenizer: Any, path: str | os.PathLike[str], num_samples: int, seq_len: int, spelling: tuple[str, str]
) -> Tensor:
    """The text file's first ``num_samples x seq_len`` tokens as ``[num_samples, seq_len]`` (the command line's)."""
    with TextFile(path) as text:
        ids = first_token_ids(tokenizer, text, num_samples * seq_len)
    return cut(_tensor(ids), num_samples, seq_len, quoted(path), spelling)


def cut(ids: Tensor, num_samples: int, seq_len: int, what: str, spelling: tuple[str, str]) -> Tensor:
    """The first ``num_samples x seq_len`` of the 1-D ``ids`` as ``[num_samples, seq_len]``, or a one-line error."""
    needed = num_samples * seq_len
    if ids.numel() < needed:
        samples, length = spelling[0].format(num_samples), spelling[1].format(seq_len)
        raise ValueError(f"{what} has {ids.numel()} tokens; {samples} x {length} needs {needed}")
    return ids[:needed].reshape(num_samples, seq_len)


def model_folder(model: object) -> Path | None:
    """``model`` as a folder path if it is one (a ``str`` or path-like), else None."""
    if isinstance(model, (str, os.PathLike)):
        return Path(model)
    return None


def load_model(model: nn.Module | str | os.PathLike[str], label: str = "model") -> nn.Module:
    """``model`` itself, or the causal LM in the folder it names, loaded as untrusted input (no folder code)."""
    folder = model_folder(model)
    if folder is None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module or a model folder's path, not {type(model).__name__}")
        return model
    if not folder.is_dir():
        raise FileNotFoundError(f"{label} {quoted(folder)} is not a folder")
    from prunereg._models.hf_folder import load_causal_lm

    return load_causal_lm(folder, label=label)


def calibration_ids(
    calibration: object,
    *,
    tokenizer: Any = None,
    num_samples: int | None = None,
    seq_len: int | None = None,
    folder: Path | None = None,
    label: str = "model",
) -> Tensor | Iterable[Tensor]:
    """Any accepted ``calibration`` as token ids: a ``[n, seq_len]`` tensor or an iterable of batches.

    ``tokenizer`` tokenises texts; without it, the tokenizer of ``folder`` (the
    model's folder, named ``label`` in errors) is loaded, if there is one.
    """
    _check_count("num_samples", num_samples, 1)
    _check_count("seq_len", seq_len, 2)
    cutting = num_samples is not None or seq_len is not None
    if isinstance(calibration, Tensor):
        if calibration.dim() == 1:
            raise ValueError(
                f"calibration is a 1-D tensor of {calibration.numel()} token ids; pass shape (samples, seq_len): "
                "ids.reshape(-1, seq_len) for samples of seq_len tokens, ids.unsqueeze(0) for one sample"
            )
        if cutting:
            raise ValueError(
                f"num_samples and seq_len cut texts and tokenizer output; calibration is already token ids of "
                f"shape {tuple(calibration.shape)}"
            )
        return calibration
    if isinstance(calibration, (bytes, bytearray)):
        raise TypeError("calibration text must be str, not bytes: decode it first")
    if isinstance(calibration, Mapping):
        return _samples_from_rows(_encoding_rows(calibration), num_samples, seq_len)
    if _is_dataset(calibration):
        columns = list(getattr(calibration, "column_names", None) or ())
        if "text" in columns:
            texts: Iterable[object] = (row["text"] for row in calibration)  # type: ignore[attr-defined]
            return _samples_from_texts(texts, tokenizer, num_samples, seq_len, folder, label)
        if "input_ids" in columns:
            rows = (row for example in calibration for row in _encoding_rows(example))  # type: ignore[attr-defined]
            return _samples_from_rows(rows, num_samples, seq_len)
        raise ValueError(
            f"the calibration dataset has no 'text' or 'input_ids' column (it has {', '.join(columns) or 'none'}); "
            "pass dataset['<column>'] as a list of texts"
        )
    if isinstance(calibration, str):
        return _samples_from_texts([calibration], tokenizer, num_samples, seq_len, folder, label)
    if not isinstance(calibration, Iterable):
        raise TypeError(
            "calibration must be token ids (a tensor), a text, a list of texts, a tokenizer's output or a dataset "
            f"with a 'text' column, not {type(calibration).__name__}"
        )
    items = iter(calibration)
    first = next(items, None)
    if first is None:
        raise ValueError("calibration holds no token ids")
    chained = itertools.chain([first], items)
    if isinstance(first, str):
        return _samples_from_texts(chained, tokenizer, num_samples, seq_len, folder, label)
    if cutting:
        raise ValueError("num_samples and seq_len cut texts and tokenizer output; calibration holds batches of ids")
    return chained  # batches of token ids: checked one by one as they are used


def check_fits_model(
    model: nn.Module,
    batches: Iterable[Tensor],
    what: str = "the calibration samples",
    hint: str = "use shorter samples",
) -> None:
    """Refuse token ids the model's embedding has no row for and samples longer than its config allows.

    Without this check both end deep in the forward as "index out of range in self".
    """
    low = high = None
    longest = 0
    for batch in batches:
        if batch.numel():
            low = int(batch.min()) if low is None else min(low, int(batch.min()))
            high = int(batch.max()) if high is None else max(high, int(batch.max()))
            longest = max(longest, batch.shape[-1])
    if low is None or high is None:
        return
    vocabulary = _vocabulary_size(model)
    if low < 0:
        raise ValueError(f"{what} hold the token id {low}; token ids are never negative")
    if vocabulary is not None and high >= vocabulary:
        raise ValueError(
            f"{what} hold the token id {high}, but the model's vocabulary has {vocabulary} tokens (ids 0 to "
            f"{vocabulary - 1}); tokenise with the model's own tokenizer"
        )
    config = getattr(model, "config", None)
    for attribute in ("max_position_embeddings", "n_positions"):
        limit = getattr(config, attribute, None)
        if isinstance(limit, int) and not isinstance(limit, bool) and longest > limit:
            raise ValueError(
                f"{what} hold {longest} tokens, but the model takes at most {limit} ({attribute} in its config); {hint}"
            )


# -- the parts ----------------------------------------------------------------------------------


def _windowed_ids(tokenizer: Any, text: str, window: int) -> list[Tensor] | None:
    """The ids of ``text`` without special tokens, window by window; None where a seam does not hold."""
    overlap = min(4096, window // 4)
    pieces: list[Tensor] = []
    start = 0  # everything before it is in ``pieces``; a token starts there
    after_cut: list[int] = []  # the last window's ids from the cut on, far enough from its end to be final
    while True:
        first = max(0, start - overlap)
        end = start + window
        encoded = tokenizer(text[first:end], add_special_tokens=False, return_offsets_mapping=True, verbose=False)
        ids = list(encoded["input_ids"])
        offsets = [(first + a, first + b) for a, b in encoded["offset_mapping"]]
        at = next((i for i, (a, _) in enumerate(offsets) if a >= start), len(ids))
        if start and (at == len(ids) or offsets[at][0] != start or (at and offsets[at - 1][1] > start)):
            return None
        if ids[at : at + len(after_cut)] != after_cut:
            return None
        if end >= len(text):
            pieces.append(_tensor(ids[at:]))
            return pieces
        cut = next(
            (k for k in range(len(ids) - MARGIN, at, -1) if offsets[k][0] >= offsets[k - 1][1] > offsets[k - 1][0]),
            None,
        )
        if cut is None:
            return None
        pieces.append(_tensor(ids[at:cut]))
        after_cut = ids[cut : cut + MARGIN // 2]
        start = offsets[cut][0]


def _special_tokens(tokenizer: Any, sample: str, add_special_tokens: bool) -> tuple[list[int], list[int]] | None:
    """The ids ``tokenizer`` puts before and after a text's own (none without ``add_special_tokens``)."""
    if not add_special_tokens:
        return [], []
    with_special = _encode(tokenizer, sample, True)
    plain = _encode(tokenizer, sample, False)
    for i in range(len(with_special) - len(plain) + 1):
        if plain and with_special[i : i + len(plain)] == plain:
            return with_special[:i], with_special[i + len(plain) :]
    return None


def _encode(tokenizer: Any, text: str, add_special_tokens: bool) -> list[int]:
    # verbose=False: the text is cut into samples here, so transformers' "longer than the maximum" warning misleads.
    encoded = tokenizer(text, add_special_tokens=add_special_tokens, verbose=False)
    return list(encoded["input_ids"])


def _tensor(ids: list[int]) -> Tensor:
    return torch.tensor(ids, dtype=torch.long)


def _check_count(name: str, value: int | None, minimum: int) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")


def _samples_from_texts(
    texts: Iterable[object],
    tokenizer: Any,
    num_samples: int | None,
    seq_len: int | None,
    folder: Path | None,
    label: str,
) -> Tensor:
    """The texts' first tokens, one text after the other, cut into ``[num_samples, seq_len]``."""
    if tokenizer is None:
        if folder is None:
            raise TypeError("calibration text needs a tokenizer: pass tokenizer=, or the model as a folder path")
        from prunereg._models.hf_folder import load_tokenizer

        tokenizer = load_tokenizer(folder, label)
    num_samples = DEFAULT_SAMPLES if num_samples is None else num_samples
    seq_len = DEFAULT_SEQ_LEN if seq_len is None else seq_len
    needed = num_samples * seq_len
    ids: list[int] = []
    n_texts = 0
    for text in texts:
        if not isinstance(text, str):
            raise TypeError(f"calibration texts must be str, not {type(text).__name__}")
        ids += first_token_ids(tokenizer, text, needed - len(ids))
        n_texts += 1
        if len(ids) >= needed:
            break
    what = "the calibration text" if n_texts == 1 else f"the {n_texts} calibration texts"
    return cut(_tensor(ids), num_samples, seq_len, what, PYTHON_SPELLING)


def _encoding_rows(encoding: Mapping[str, Any]) -> list[Tensor]:
    """A tokenizer output's rows of token ids (1-D), padding (``attention_mask`` 0) left out."""
    if "input_ids" not in encoding:
        raise ValueError(f"calibration has no 'input_ids' (it has {', '.join(map(str, encoding)) or 'nothing'})")
    rows = _rows(encoding["input_ids"], "input_ids")
    mask = encoding.get("attention_mask")
    if mask is None:
        return rows
    masks = _rows(mask, "attention_mask")
    if [r.shape for r in rows] != [m.shape for m in masks]:
        raise ValueError("calibration's attention_mask has another shape than its input_ids")
    return [row[m.bool()] for row, m in zip(rows, masks, strict=True)]


def _rows(value: Any, name: str) -> list[Tensor]:
    if isinstance(value, Tensor):
        tensor = value
    elif _is_flat(value):
        tensor = torch.tensor(value, dtype=torch.long)
    elif isinstance(value, Iterable) and not isinstance(value, (str, bytes)):
        return [r for row in value for r in _rows(row, name)]
    else:
        raise TypeError(f"calibration {name} must be token ids (rows of ints), not {type(value).__name__}")
    if tensor.dtype.is_floating_point or tensor.dtype.is_complex:
        raise TypeError(f"calibration {name} must hold integers, not {tensor.dtype}")
    if tensor.dim() == 1:
        return [tensor.long()]
    if tensor.dim() == 2:
        return list(tensor.long())
    raise ValueError(f"calibration {name} must be one row or rows of token ids, got shape {tuple(tensor.shape)}")


def _is_flat(value: Any) -> bool:
    """Whether ``value`` is a list of ints (one row), not a list of rows."""
    return isinstance(value, (list, tuple)) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)


def _samples_from_rows(rows: Iterable[Tensor], num_samples: int | None, seq_len: int | None) -> Tensor:
    """Rows of one length as they are; with ``num_samples``/``seq_len``, joined and cut as a text is."""
    if num_samples is None and seq_len is None:
        collected = list(rows)
        if not collected or not any(row.numel() for row in collected):
            raise ValueError("calibration holds no token ids")
        lengths = sorted({row.numel() for row in collected})
        if len(lengths) > 1:
            raise ValueError(
                f"calibration rows hold {lengths[0]} to {lengths[-1]} tokens (padding left out); pass seq_len= "
                "(and num_samples=) to cut them into samples of one length"
            )
        return torch.stack(collected)
    num_samples = DEFAULT_SAMPLES if num_samples is None else num_samples
    seq_len = DEFAULT_SEQ_LEN if seq_len is None else seq_len
    needed, taken, total = num_samples * seq_len, [], 0
    for row in rows:
        taken.append(row)
        total += row.numel()
        if total >= needed:
            break
    joined = torch.cat(taken) if taken else torch.zeros(0, dtype=torch.long)
    return cut(joined, num_samples, seq_len, "calibration", PYTHON_SPELLING)


def _is_dataset(value: object) -> bool:
    """A ``datasets.Dataset`` or anything like it: iterable rows (mappings) and ``column_names``."""
    return hasattr(value, "column_names") and isinstance(value, Iterable) and not isinstance(value, (str, Mapping))


def _vocabulary_size(model: nn.Module) -> int | None:
    get_input_embeddings = getattr(model, "get_input_embeddings", None)
    try:
        embeddings = get_input_embeddings() if callable(get_input_embeddings) else None
    except NotImplementedError:
        embeddings = None
    if isinstance(embeddings, nn.Embedding):
        return embeddings.num_embeddings
    return None
