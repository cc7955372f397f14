"""The report `sv bench` fills: one `Row` per figure, printed as it is measured (beside its
roofline where it has one) and again as the table that ends a run; with a JSON path, the file
is rewritten after each row, so a run cut short (a device call's time limit) keeps what it
measured."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
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
    json_path: Path | None = None

    def add(self, row: Row) -> None:
        self.rows.append(row)
        frac = f" ({row.fraction} of {row.roofline:,.0f})" if row.roofline else ""
        print(f"[bench] {row.name}: {row.value:,.2f} {row.unit}{frac} {row.note}", flush=True)
        if self.json_path is not None:
            rows = [r.__dict__ for r in self.rows]
            self.json_path.write_text(json.dumps({"info": self.info, "rows": rows}, indent=1))

    def table(self) -> str:
        lines = [f"preset {self.info['preset']}"] if "preset" in self.info else []
        lines += [f"{'benchmark':34} {'value':>14} {'unit':10} {'roofline':>12} {'frac':>5}  note"]
        for r in self.rows:
            roof = f"{r.roofline:,.0f}" if r.roofline else ""
            lines.append(
                f"{r.name:34} {r.value:>14,.2f} {r.unit:10} {roof:>12} {r.fraction:>5}  {r.note}"
            )
        return "\n".join(lines)
