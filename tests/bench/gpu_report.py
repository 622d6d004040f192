"""The GPU bench's output: one table (a line per arm, its ratios in the last column), the
report rows `tests.bench.run` collects, and the JSON written with `--out`."""

from __future__ import annotations

from dataclasses import dataclass

from kubeddp.trainer.workloads.charlm import VOCAB_SIZE
from tests.bench.common import Row, not_measured
from tests.bench.gpu_flops import charlm_train_flops_per_token
from tests.bench.gpu_runs import HAND, KUBEDDP, Arm, ArmResult, BenchModel

GIB = 1024**3
# Goals from issue 15: kubeddp at least as fast as the hand-written loop with every default
# on, and MFU >= 0.40 on the 12x768 model with compile on an H100/H200.
GOAL_VS_HAND = ">= 1.0"
GOAL_MFU_COMPILED = ">= 0.40"


@dataclass(frozen=True)
class Comparison:
    """tokens/s of `over` / tokens/s of `under`, shown on the table line of `shown_on`."""

    name: str
    over: str
    under: str
    shown_on: str
    text: str  # table cell, "{r}" is the ratio
    goal: str = ""


def comparisons(model: BenchModel) -> list[Comparison]:
    def key(trainer: str, mode: str, precision: str) -> str:
        return f"{model.name}:{trainer}:{mode}:{precision}"

    k_eager, k_fp32 = key(KUBEDDP, "eager", "bf16"), key(KUBEDDP, "eager", "fp32")
    k_comp, h_eager = key(KUBEDDP, "compiled", "bf16"), key(HAND, "eager", "bf16")
    h_comp = key(HAND, "compiled", "bf16")
    return [
        Comparison(
            "kubeddp / hand-written loop, eager bf16",
            k_eager,
            h_eager,
            k_eager,
            "{r}x hand-written",
            GOAL_VS_HAND,
        ),
        Comparison("bf16 / fp32 speedup, kubeddp eager", k_eager, k_fp32, k_fp32, "bf16 {r}x"),
        Comparison(
            "kubeddp / hand-written loop, compiled bf16",
            k_comp,
            h_comp,
            h_comp,
            "kubeddp {r}x this",
            GOAL_VS_HAND,
        ),
        Comparison("compiled / eager, kubeddp bf16", k_comp, k_eager, k_comp, "{r}x eager"),
        Comparison("compiled / eager, hand-written bf16", h_comp, h_eager, h_comp, "{r}x eager"),
    ]


@dataclass
class GpuReport:
    models: list[BenchModel]
    results: list[ArmResult]
    peak_flops: float  # measured bf16 matmul FLOP/s
    device: str  # card and versions, one line
    budget_seconds: float
    runs_seconds: float

    def _by_key(self) -> dict[str, ArmResult]:
        return {r.arm.key: r for r in self.results}

    def mfu(self, result: ArmResult) -> float:
        m = result.arm.model.charlm
        flops = charlm_train_flops_per_token(m.n_layer, m.n_embd, m.seq_len, VOCAB_SIZE)
        return flops * result.tokens_per_s / self.peak_flops

    def compile_seconds(self, result: ArmResult) -> float | None:
        """Launch to the first timed step, minus the same for the eager run of the same
        trainer and model (same step index): what compilation added before steady state."""
        arm = result.arm
        eager = self._by_key().get(f"{arm.model.name}:{arm.trainer}:eager:{arm.precision}")
        if not (arm.compiled and result.ok and eager and eager.ok):
            return None
        step = arm.warmup
        return result.seconds_to_step(step) - eager.seconds_to_step(step)

    def ratio(self, c: Comparison) -> float | None:
        found = self._by_key()
        over, under = found.get(c.over), found.get(c.under)
        if not (over and under and over.ok and under.ok):
            return None
        return over.tokens_per_s / under.tokens_per_s

    def _ratio_cell(self, arm: Arm) -> str:
        cells = []
        for c in comparisons(arm.model):
            if c.shown_on == arm.key and (r := self.ratio(c)) is not None:
                cells.append(c.text.format(r=f"{r:.2f}"))
        return "; ".join(cells) or "-"

    def _cells(self, res: ArmResult) -> list[str]:
        arm = res.arm
        fastest, slowest = max(res.window_tokens_per_s), min(res.window_tokens_per_s)
        mem = res.max_memory_bytes
        compile_s = self.compile_seconds(res)
        return [
            arm.model.title,
            arm.label(),
            f"{res.tokens_per_s:,.0f}",
            f"{res.step_ms:.1f} ({1000 * res.tokens_per_step / fastest:.1f}-"
            f"{1000 * res.tokens_per_step / slowest:.1f})",
            f"{self.mfu(res):.3f}",
            "not measured" if mem is None else f"{mem / GIB:.2f} GiB",
            f"{res.seconds_to_step(arm.warmup):.1f} s",
            "-" if compile_s is None else f"{compile_s:.1f} s",
            self._ratio_cell(arm),
        ]

    def table(self) -> str:
        head = ["model", "run", "tok/s", "ms/step", "MFU", "peak mem", "to 1st timed"]
        head += ["compile", "ratio"]
        # A run that did not finish shows its status after the model and run columns.
        rows = [
            self._cells(r) if r.ok else [r.arm.model.title, r.arm.label(), r.status]
            for r in self.results
        ]
        widths = [
            max(len(row[i]) for row in [head, *rows] if len(row) == len(head) or i < 2)
            for i in range(len(head))
        ]
        text = [
            "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)).rstrip()
            for row in [head, *rows]
        ]
        return "\n".join(
            [
                f"GPU bench: {self.device}",
                f"bf16 matmul peak {self.peak_flops / 1e12:.1f} TFLOP/s (MFU is against it); "
                f"runs took {self.runs_seconds:.0f} s of a {self.budget_seconds:.0f} s budget",
                "tok/s: median of 10-step windows after warm-up; ms/step: median (fastest-"
                "slowest window); to 1st timed: launch to the first timed step; compile: that "
                "minus the eager run's",
                "",
                *text,
            ]
        )

    def rows(self) -> list[Row]:
        """The figures as report rows (section gpu), for `python -m tests.bench.run`."""
        rows = []
        for model in self.models:
            for c in comparisons(model):
                name = f"{model.title}: {c.name}"
                ratio = self.ratio(c)
                if ratio is None:
                    rows.append(not_measured("gpu", name, self._missing(c)))
                    continue
                found = self._by_key()
                absolute = (
                    f"{found[c.over].tokens_per_s:,.0f} vs {found[c.under].tokens_per_s:,.0f} tok/s"
                )
                rows.append(Row("gpu", name, ratio, c.under, absolute, c.goal, self.device))
            for res in self.results:
                arm = res.arm
                if arm.model != model or arm.trainer != KUBEDDP or arm.precision != "bf16":
                    continue
                name = f"{model.title}: model FLOPs utilisation, {arm.label()}"
                if not res.ok:
                    rows.append(not_measured("gpu", name, res.status))
                    continue
                goal = GOAL_MFU_COMPILED if arm.compiled and model is self.models[0] else ""
                compile_s = self.compile_seconds(res)
                note = "" if compile_s is None else f"compile {compile_s:.1f} s; "
                rows.append(
                    Row(
                        "gpu",
                        name,
                        self.mfu(res),
                        f"measured bf16 matmul peak ({self.peak_flops / 1e12:.1f} TFLOP/s)",
                        f"{res.tokens_per_s:,.0f} tok/s",
                        goal,
                        f"{note}{self.device}",
                    )
                )
        return rows

    def _missing(self, c: Comparison) -> str:
        found = self._by_key()
        why = [f"{k}: {found[k].status}" for k in (c.over, c.under) if k in found]
        return "; ".join(w for w in why if not w.endswith(": ok")) or "not run"

    def to_dict(self) -> dict:
        return {
            "device": self.device,
            "peak_bf16_matmul_flops": self.peak_flops,
            "budget_seconds": self.budget_seconds,
            "runs_seconds": self.runs_seconds,
            "arms": [
                r.to_dict()
                | ({"mfu": self.mfu(r), "compile_seconds": self.compile_seconds(r)} if r.ok else {})
                for r in self.results
            ],
            "rows": [r.to_dict() for r in self.rows()],
        }
