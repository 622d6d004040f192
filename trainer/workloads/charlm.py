"""A small GPT-style character (byte) language model trained on text found on the machine.

Tokens are raw bytes (vocab 256), so the parameter shapes depend only on the config, never
on which corpus a pod happened to read: a checkpoint fits every corpus.
"""

from __future__ import annotations

import hashlib
import math
import os
import sysconfig
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import Dataset

from ..config import WorkloadConfig
from .base import Workload, WorkloadError, count_params, human_count, seeded

VOCAB_SIZE = 256
TRAIN_FRACTION = 0.9
# Third-party packages differ between images built a day apart; the stdlib does not.
SKIPPED_STDLIB_DIRS = {"site-packages", "dist-packages", "__pycache__"}


# ---- corpus -------------------------------------------------------------------------------


def _sorted_walk(root: Path, suffix: str, skip_dirs: set[str]) -> list[Path]:
    """Files under `root` in a fixed order (directories top-down, names sorted at each level)."""
    files: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in skip_dirs and not d.startswith("."))
        files.extend(
            Path(dirpath, name)
            for name in sorted(filenames)
            if name.endswith(suffix) and not name.startswith(".")
        )
    return files


def _read_files(files: list[Path], max_bytes: int) -> bytes:
    chunks: list[bytes] = []
    total = 0
    for path in files:
        if max_bytes and total >= max_bytes:
            break
        try:
            data = path.read_bytes()
        except OSError:
            continue  # unreadable files are skipped the same way on every rank of one image
        if max_bytes:
            data = data[: max_bytes - total]
        chunks.append(data)
        total += len(data)
    return b"".join(chunks)


def load_corpus(corpus: str, max_bytes: int) -> tuple[bytes, str]:
    """Return (text bytes, a short name for the log); `max_bytes` 0 means no limit."""
    if not corpus:
        root = Path(sysconfig.get_paths()["stdlib"])
        files = _sorted_walk(root, ".py", SKIPPED_STDLIB_DIRS)
        return _read_files(files, max_bytes), f"Python stdlib {root}"
    path = Path(corpus).expanduser()
    if path.is_file():
        return _read_files([path], max_bytes), str(path)
    if path.is_dir():
        return _read_files(_sorted_walk(path, "", {"__pycache__"}), max_bytes), f"{path}/"
    raise WorkloadError(
        f"workload.corpus {corpus!r} is not a file or directory; "
        "give a text file, a directory of text files, or '' for the Python stdlib"
    )


# ---- data ---------------------------------------------------------------------------------


class ByteWindows(Dataset):
    """Item i = (x, y): bytes [i*seq_len, i*seq_len + seq_len) and the same shifted by one.

    Windows advance by seq_len, so every byte is a target exactly once per epoch.
    """

    def __init__(self, data: torch.Tensor, seq_len: int) -> None:
        self.data = data
        self.seq_len = seq_len

    def __len__(self) -> int:
        return (len(self.data) - 1) // self.seq_len

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= index < len(self):
            raise IndexError(f"window {index} out of range 0..{len(self) - 1}")
        start = index * self.seq_len
        window = self.data[start : start + self.seq_len + 1].long()
        return window[:-1], window[1:]


# ---- model --------------------------------------------------------------------------------


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int, dropout: float) -> None:
        super().__init__()
        self.n_head = n_head
        self.qkv = nn.Linear(n_embd, 3 * n_embd)
        self.proj = nn.Linear(n_embd, n_embd)
        self.dropout = dropout
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, embd = x.shape
        q, k, v = self.qkv(x).split(embd, dim=2)
        # (batch, seq, embd) -> (batch, head, seq, head_dim)
        q, k, v = (t.view(batch, seq, self.n_head, -1).transpose(1, 2) for t in (q, k, v))
        out = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True
        )
        out = out.transpose(1, 2).reshape(batch, seq, embd)
        return self.resid_dropout(self.proj(out))


class Block(nn.Module):
    """Pre-LN transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, n_embd: int, n_head: int, dropout: float) -> None:
        super().__init__()
        self.ln_attn = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, dropout)
        self.ln_mlp = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(
            nn.Linear(n_embd, 4 * n_embd),
            nn.GELU(),
            nn.Linear(4 * n_embd, n_embd),
            nn.Dropout(dropout),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_attn(x))
        return x + self.mlp(self.ln_mlp(x))


class CharGPT(nn.Module):
    def __init__(
        self, vocab: int, seq_len: int, n_layer: int, n_head: int, n_embd: int, dropout: float
    ) -> None:
        super().__init__()
        self.seq_len = seq_len
        self.tok_emb = nn.Embedding(vocab, n_embd)
        self.pos_emb = nn.Embedding(seq_len, n_embd)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(n_embd, n_head, dropout) for _ in range(n_layer))
        self.ln_final = nn.LayerNorm(n_embd)
        self.head = nn.Linear(n_embd, vocab, bias=False)
        self.head.weight = self.tok_emb.weight  # tied: fewer parameters, learns faster here
        self._init_weights(n_layer)

    def _init_weights(self, n_layer: int) -> None:
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        # Residual branches add up over 2 * n_layer sums; scale them so the stream's variance
        # does not grow with depth.
        for block in self.blocks:
            for out_proj in (block.attn.proj, block.mlp[2]):
                nn.init.normal_(out_proj.weight, std=0.02 / math.sqrt(2 * n_layer))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """(batch, seq) byte ids -> (batch, seq, vocab) logits."""
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.drop(self.tok_emb(tokens) + self.pos_emb(positions))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_final(x))


def next_byte_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    inputs, targets = batch
    logits = model(inputs)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


# ---- workload -----------------------------------------------------------------------------


def build(cfg: WorkloadConfig, seed: int) -> Workload:
    if cfg.n_layer < 1 or cfg.n_head < 1 or cfg.n_embd < 1:
        raise WorkloadError(
            f"workload.n_layer/n_head/n_embd are {cfg.n_layer}/{cfg.n_head}/{cfg.n_embd}; "
            "each must be >= 1"
        )
    if not 0.0 <= cfg.dropout < 1.0:
        raise WorkloadError(f"workload.dropout is {cfg.dropout}; use a value in [0, 1)")
    text, source = load_corpus(cfg.corpus, cfg.corpus_max_bytes)
    needed = math.ceil((cfg.seq_len + 1) / (1 - TRAIN_FRACTION))
    if len(text) < needed:
        raise WorkloadError(
            f"charlm corpus {source} has {len(text)} bytes; seq_len {cfg.seq_len} needs at "
            f"least {needed} (one window in the 10% eval split); use a larger corpus, raise "
            "workload.corpus_max_bytes or lower workload.seq_len"
        )
    data = torch.frombuffer(bytearray(text), dtype=torch.uint8)
    split = int(len(data) * TRAIN_FRACTION)
    train_set = ByteWindows(data[:split], cfg.seq_len)
    eval_set = ByteWindows(data[split:], cfg.seq_len)
    with seeded(seed):
        model = CharGPT(VOCAB_SIZE, cfg.seq_len, cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.dropout)
    digest = hashlib.sha256(text).hexdigest()[:12]
    description = (
        f"charlm: {human_count(count_params(model))} params, {len(text) / 1e6:.2f}M bytes of "
        f"{source}, sha256 {digest}, vocab {VOCAB_SIZE} bytes, seq_len {cfg.seq_len}, "
        f"{len(train_set)} train / {len(eval_set)} eval windows"
    )
    return Workload(model, train_set, eval_set, next_byte_loss, cfg.seq_len, description)
