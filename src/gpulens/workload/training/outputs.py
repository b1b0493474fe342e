"""Where the training writer puts what it measured: the store file, or the node's agent.

`StepWriter` turns the loop's queue into steps, evaluations, stray losses and checkpoints, and
events; one of these outputs takes them:
- `StoreOutput` writes them into a `Store` (series with cached ids, and events): one machine;
- `AgentOutput` hands each one as a record (the shape `gpulens replay` imports, see
  `workload.wire`) to an `AgentSender`; the agent writes them through the training importer, so a
  step sent over the socket is stored as the same series and event as one written here.
"""

from __future__ import annotations

from typing import Any, Protocol

from gpulens.errors import StoreError
from gpulens.store import Store
from gpulens.vocab import names as N
from gpulens.workload.agent_client import AgentSender
from gpulens.workload.training.records import StepRecord, step_series_values


class StepOutput(Protocol):
    def step(self, rec: StepRecord) -> bool:
        """Take one step; False when it cannot now (retried later, in order)."""
        ...

    def sample(self, name: str, t: float, value: float) -> None:
        """A sample of its own: a loss logged after its step, a checkpoint before the first step."""
        ...

    def evaluation(self, t: float, seconds: float, data: dict[str, Any]) -> None: ...

    def event(self, kind: str, t: float, data: dict[str, Any]) -> None: ...

    def commit(self) -> None:
        """Make what was taken durable (StoreError when it cannot now)."""
        ...

    def describe_pending(self) -> str: ...


class StoreOutput:
    def __init__(self, store: Store, labels: dict[str, str]):
        self.store = store
        self.labels = labels
        self._ids: dict[str, int] = {}

    def step(self, rec: StepRecord) -> bool:
        rows = []
        try:
            for name, value in step_series_values(rec):
                sid = self._ids.get(name)
                if sid is None:
                    sid = self._ids[name] = self.store.series_id(name, self.labels)
                rows.append((sid, value))
        except StoreError:
            return False
        t = rec.t_end
        try:
            self.store.write_many([(sid, t, value) for sid, value in rows])
            self.store.event(N.EV_TRAIN_STEP, t, self.labels, rec.to_event_data())
        except StoreError:
            pass  # a failing auto-commit keeps its rows buffered in the store for the next one
        return True

    def sample(self, name: str, t: float, value: float) -> None:
        self.store.write(name, self.labels, t, value)

    def evaluation(self, t: float, seconds: float, data: dict[str, Any]) -> None:
        self.store.write(N.TRAIN_EVAL_SECONDS, self.labels, t, seconds)
        self.store.event(N.EV_TRAIN_EVAL, t, self.labels, data)

    def event(self, kind: str, t: float, data: dict[str, Any]) -> None:
        self.store.event(kind, t, self.labels, data)

    def commit(self) -> None:
        self.store.flush()

    def describe_pending(self) -> str:
        return f"{self.store.pending_count} buffered samples could not be written to {self.store.path}"


class AgentOutput:
    def __init__(self, sender: AgentSender, labels: dict[str, str]):
        self.sender = sender
        self.labels = labels

    def step(self, rec: StepRecord) -> bool:
        self.sender.send({"kind": N.EV_TRAIN_STEP, **self.labels, **rec.to_event_data()})
        return True

    def sample(self, name: str, t: float, value: float) -> None:
        self.sender.send({"kind": name, "t": t, "value": value, **self.labels})

    def evaluation(self, t: float, seconds: float, data: dict[str, Any]) -> None:
        self.sender.send({"kind": N.EV_TRAIN_EVAL, "t": t, **self.labels, **data, "seconds": seconds})

    def event(self, kind: str, t: float, data: dict[str, Any]) -> None:
        self.sender.send({"kind": kind, "t": t, **self.labels, **{k: v for k, v in data.items() if k not in _TIME_KEYS}})

    def commit(self) -> None:
        pass  # the sender's thread delivers; a monitor's flush()/close() waits for it

    def describe_pending(self) -> str:
        return f"{self.sender.pending} records could not be sent to the agent at {self.sender.address}"


# A record's moment is its `t`: these keys would take precedence over it (workload.importers.event_time).
_TIME_KEYS = ("t_end", "end")
