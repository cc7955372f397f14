"""The device mirror of the scheduler's block tables: one table row of page ids per sequence.

Rows are uploaded only when a sequence gets a new page (or is admitted), so a decode step
never re-uploads block tables. One extra row, the scratch table row, points every position at the
scratch page: padding rows of a CUDA-graph batch and the warm-up's prefills read and write
only there.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from sv_model.uploads import upload


class DeviceBlockTables:
    """`tensor` [max_num_seqs + 1, max_pages_per_seq] int32 on the device; unused entries hold
    the scratch page. Row `scratch_table_row` (= max_num_seqs) points only at the scratch page."""

    def __init__(
        self,
        max_num_seqs: int,
        max_model_len: int,
        page_size: int,
        scratch_page: int,
        device: torch.device,
    ) -> None:
        self.max_model_len = max_model_len
        self.max_pages_per_seq = max_pages_per_seq = -(-max_model_len // page_size)
        self.scratch_page = scratch_page
        self.scratch_table_row = max_num_seqs
        self.device = device
        self.tensor = torch.full(
            (max_num_seqs + 1, max_pages_per_seq), scratch_page, dtype=torch.int32, device=device
        )

    def set_rows(self, rows: Sequence[tuple[int, Sequence[int]]]) -> None:
        """Replace the given table rows, (table row, pages) each, in one upload."""
        if not rows:
            return
        width = max(len(pages) for _, pages in rows)
        if width > self.max_pages_per_seq:
            raise ValueError(
                f"a block table of {width} pages exceeds the {self.max_pages_per_seq} pages of "
                f"max_model_len={self.max_model_len}"
            )
        host = np.full((len(rows), width + 1), self.scratch_page, dtype=np.int32)
        for i, (table_row, pages) in enumerate(rows):
            host[i, 0] = table_row
            host[i, 1 : len(pages) + 1] = pages
        dev = upload(host, self.device)
        self.tensor[dev[:, 0].long(), :width] = dev[:, 1:]
