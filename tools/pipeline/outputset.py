"""The outputs of one run, by query: made for the chosen queries, opened together before any
packet is read, closed together, and the one-line error a failed run reports (`run`,
`collect`)."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping

from common.errors import OopscopeError
from tools.errors import RunError
from tools.pipeline.config import RunConfig, output_format
from tools.results.appended import QueryOutput

log = logging.getLogger(__name__)


def output_for(config: RunConfig, qp, out: str, several: bool, checkpoint,
               resume, plan=None) -> QueryOutput:
    """A query's output. In a resumable run, one that can be cut back to its last whole batch
    logs its batches; a Parquet output (no footer until closed) or one written whole at the
    end keeps its batches as part files under the checkpoint (`tools.results.parts`). A
    table shows when each window starts (`plan`: the query's file, whose sources say whether
    its windows are times)."""
    from tools.pipeline.resume import output_log, output_parts
    from tools.pipeline.windows import window_starts
    from tools.results.formats import TableWriter, arrow_schema
    from tools.results.parts import PartFiles

    fmt = output_format(config, out)
    buffered = not config.streaming and (fmt == "table" or (several and out == "-"))
    resume_log = parts = None
    if resume is not None:
        if fmt == "parquet" or buffered:
            parts = PartFiles(output_parts(checkpoint, qp.name))
        elif out != "-":
            resume_log = output_log(checkpoint, qp.name)
    window = getattr(qp.high.window, "column", None)
    writer = None
    if fmt == "table" and plan is not None:
        writer = TableWriter(window, window_starts(plan, qp))
    return QueryOutput(qp.name, qp.high.outputs, fmt, out,
                       arrow_schema(qp.name, qp.high.outputs), buffered=buffered,
                       title=qp.name if several and out == "-" else None,
                       keep=config.keep_results, window=window,
                       resume_log=resume_log, parts=parts, writer=writer)


class RunOutputs(Mapping[str, QueryOutput]):
    """Query name -> its output, for the `chosen` (query plan, output) pairs of a run
    (`resume`: a resumable run's, whose outputs log their batches under `checkpoint`)."""

    def __init__(self, config: RunConfig, chosen, checkpoint, resume=None, plan=None):
        several = sum(1 for _, out in chosen if out == "-") > 1
        self._outputs = {qp.name: output_for(config, qp, out, several, checkpoint, resume,
                                             plan)
                         for qp, out in chosen}

    def __getitem__(self, name: str) -> QueryOutput:
        return self._outputs[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._outputs)

    def __len__(self) -> int:
        return len(self._outputs)

    def open(self) -> None:
        """Open every output (a read-only or full file system fails here, in one line)."""
        opened = []
        try:
            for o in self._outputs.values():
                o.open()
                opened.append(o)
        except BaseException:
            _close(opened, complete=False)
            raise

    def on_fault(self, callback) -> None:
        """`callback()` when a write fails (a run stops its sources then)."""
        for o in self._outputs.values():
            o.on_fault = callback

    def close(self, complete: bool) -> None:
        """Close every output (each even when one fails); then raise the first failure."""
        _close(self._outputs.values(), complete)

    def close_quietly(self) -> None:
        """After an error: close what is still open (a no-op for the others); a fault of
        theirs is kept in the output and reported by `fault`."""
        for o in self._outputs.values():
            try:
                o.close(complete=False)
            except (OopscopeError, OSError) as exc:
                log.debug("closing the output %s after an error: %s", o.out, exc)

    def fault(self, exc: OopscopeError) -> BaseException:
        """The error a failed run reports, in one line: an output's own fault (its path and
        OS error; the stage's error that followed it says less) and what that output holds,
        or the run's error and what the outputs hold (the windows written before it)."""
        faulty = [o for o in self._outputs.values() if o.fault is not None]
        if faulty:
            o = faulty[0]
            if o.out == "-" and isinstance(o.fault, BrokenPipeError):
                return o.fault               # `| head`: not an error (tools.cli)
            more = f" ({len(faulty) - 1} more outputs failed)" if len(faulty) > 1 else ""
            return RunError(o.fault_message() + more)
        held = [f"{o.out} holds {o.written()}" for o in self._outputs.values()
                if o.held and o.out != "-" and o.format != "parquet"]
        if not held:
            return exc
        # the same class, so a caller that tells errors apart still can
        try:
            return type(exc)(f"{exc}; written before it: {'; '.join(held)}")
        except TypeError:                   # an error class with other arguments
            return RunError(f"{exc}; written before it: {'; '.join(held)}")


def _close(outputs, complete: bool) -> None:
    error: BaseException | None = None
    for o in outputs:
        try:
            o.close(complete=complete)
        except (OopscopeError, OSError) as exc:
            error = error or exc
    if error is not None:
        raise error
