"""The report `sv bench` fills: one `Row` per figure, printed as it is measured (beside its
roofline where it has one) and again as the table that ends a run."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Row:
    name: str
    value: float
    unit: str
    roofline: float | None = None
    note: str = ""

    @property
    def fraction(self) -> str:
        if not self.roofline:
            return ""
        return f"{self.value / self.roofline:.2f}"


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)

    def add(self, row: Row) -> None:
        self.rows.append(row)
        frac = f" ({row.fraction} of {row.roofline:,.0f})" if row.roofline else ""
        print(f"[bench] {row.name}: {row.value:,.2f} {row.unit}{frac} {row.note}", flush=True)

    def table(self) -> str:
        lines = [f"preset {self.info['preset']}"] if "preset" in self.info else []
        lines += [f"{'benchmark':34} {'value':>14} {'unit':10} {'roofline':>12} {'frac':>5}  note"]
        for r in self.rows:
            roof = f"{r.roofline:,.0f}" if r.roofline else ""
            lines.append(
                f"{r.name:34} {r.value:>14,.2f} {r.unit:10} {roof:>12} {r.fraction:>5}  {r.note}"
            )
        return "\n".join(lines)
