"""What every finding shares: its result type, the loader it reads, and the words."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import pandas as pd

from ....display import duration_s, prediction_text
from ..budget import LoaderBudget
from ..loaders import Loader, ProcessTraining, iterator_codes
from ..pipeline import PipelineModel
from ..what_if import WhatIf

# A finding must be worth the change: its seconds must reach this share of the node's
# profiled time (first to last event). Below it a job is clean.
MIN_SHARE_OF_JOB = 0.02
# Evidence lists are capped; counts say how many there were.
MAX_LISTED = 20


@dataclass(frozen=True)
class Recommendation:
    id: str
    text: str
    evidence: dict
    saving_s: float | None = None
    change: dict | None = None  # the DataLoader settings to change, when one fixes it
    predicted: dict | None = None  # {"wait_fraction", "training_s"} with the change


@dataclass
class LoaderContext:
    """One training loader of a process, with its budget and a what-if on it."""
    process: ProcessTraining
    loader: Loader
    model: PipelineModel | None
    budget: LoaderBudget
    what_if: Callable[[dict], WhatIf]
    asked: list = field(default_factory=list)  # what-ifs the findings ran

    def worth(self, seconds: float | None, share: float = MIN_SHARE_OF_JOB) -> bool:
        return seconds is not None and self.process.span_us > 0 and seconds * 1e6 >= share * self.process.span_us

    def predict(self, change: dict) -> WhatIf:
        result = self.what_if(change)
        self.asked.append(result)
        return result

    def evidence(self, **more) -> dict:
        return {"node": self.process.host, "process": self.process.id, "rank": self.process.rank,
                "loader": self.loader.name, "num_workers": self.loader.num_workers,
                "num_workers_inferred": self.loader.num_workers_inferred,
                "batches": self.budget.evidence.get("batches"), "part_s": None,
                # (Only where loaders of these settings ran side by side: which of them, of how many.)
                **({"alike": list(self.loader.alike)} if self.loader.alike else {}), **more}

    def recommend(self, kind: str, text: str, evidence: dict, seconds: float | None,
                  result: WhatIf | None, told: bool = True) -> Recommendation:
        """A finding whose saving is its change's prediction (else the part's seconds). told=False:
        the prediction cannot tell the change's effect from none; the part's seconds rank the
        finding, and the prediction rides along."""
        if result is not None and result.predicted is not None and not told:
            return Recommendation(kind, text, evidence, None if seconds is None else round(seconds, 3),
                                  result.change, result.predicted)
        if result is not None and result.predicted is not None:
            saving = result.saving_s
            return Recommendation(kind, text, evidence, round(max(saving, 0.0), 3), result.change,
                                  result.predicted)
        return Recommendation(kind, text, evidence, None if seconds is None else round(seconds, 3),
                              None if result is None else result.change, None)


def predicted_text(result: WhatIf | None) -> str:
    if result is None or result.predicted is None:
        return ""
    return prediction_sentence(result.now, result.predicted)


def prediction_sentence(now: dict, then: dict, lead: str = "Predicted") -> str:
    """A prediction's sentence: `now` and `then` as a WhatIf's ({"wait_fraction", "training_s"})."""
    saving = round(now["training_s"] - then["training_s"], 6)
    return f" {lead}: {prediction_text(now, then)} (saves {duration_s(max(saving, 0.0))})."


def batch_list(calls: pd.DataFrame, rows) -> list[dict]:
    """Batches for evidence: iterator number (1.. in time order), batch (its number in its epoch;
    in one a recording began in, as rounds.py places it: from at least a round before the
    recording's first batch, whose true number is not recorded), start, wait, worker."""
    rows = list(rows)[:MAX_LISTED]
    numbers = iterator_codes(calls)[rows] + 1
    picked = calls.iloc[rows]
    return [{"iterator": int(number), "batch": int(r.index_), "start_us": int(r.start_us),
             "duration_s": round(r.duration_us / 1e6, 6),
             "worker_id": None if pd.isna(r.worker_id) else int(r.worker_id)}
            for number, r in zip(numbers.tolist(), picked.rename(columns={"index": "index_"}).itertuples())]
