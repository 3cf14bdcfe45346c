"""Output constraints compiled to token grammars with xgrammar, once per constraint.

The transformers engine decodes with the compiled grammar (a matcher per row masks each step's logits). The
vLLM engine compiles the same grammar before submitting, although vLLM compiles its own: a constraint that
xgrammar cannot compile is then the client's 400 before it reaches the engine core, and the compile time of
every new schema is measured here (``hyocr_grammar_compile_seconds``) where vLLM reports none. Compiled
grammars are kept in an LRU cache keyed by the constraint (schemas are canonical JSON text), so an invoice
schema sent with every page compiles once. The bounds that keep a compile short are pipeline/structured.py's.
"""

from __future__ import annotations

import asyncio
import contextvars
import importlib.util
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..errors import InvalidRequest, engine_failure
from ..observability.logs import record
from ..types import StructuredOutput

CACHE_SIZE = 64  # compiled grammars kept (a few MB each for a 120k-token vocabulary)
COMPILERS = 2  # new constraints compiled at once


def available() -> bool:
    return importlib.util.find_spec("xgrammar") is not None


class Grammars:
    """Compiled grammars for one tokenizer. ``compile`` blocks (run it off the event loop); thread-safe.
    Cheap to make: xgrammar's view of the vocabulary (~0.5 s for 120k tokens) is built at the first compile,
    so a server that never sees a constraint never pays for it."""

    def __init__(self, tokenizer: Any, vocab_size: int, *, stop_token_ids: set[int] | None = None,
                 threads: int = 2) -> None:
        self._tokenizer, self._vocab_size, self._threads = tokenizer, vocab_size, threads
        # The model's own end tokens end a complete value (HunyuanOCR has two; the tokenizer names one)
        self._stops = {"stop_token_ids": sorted(stop_token_ids)} if stop_token_ids else {}
        self._compiler: Any = None
        self._cache: OrderedDict[StructuredOutput, Any] = OrderedDict()
        self._lock = threading.Lock()
        self._compiling: dict[StructuredOutput, threading.Lock] = {}  # one compile per new constraint
        # Compiles wait here, not on the default pool the engines' image work shares
        self.executor = ThreadPoolExecutor(max_workers=COMPILERS, thread_name_prefix="grammar")

    @property
    def compiler(self) -> Any:
        with self._lock:
            if self._compiler is None:
                import xgrammar as xgr

                info = xgr.TokenizerInfo.from_huggingface(self._tokenizer, vocab_size=self._vocab_size,
                                                          **self._stops)
                self._compiler = xgr.GrammarCompiler(info, max_threads=self._threads, cache_enabled=False)
            return self._compiler

    async def acompile(self, constraint: StructuredOutput) -> Any:
        return await self._in_pool(self.compile, constraint)

    async def amatcher(self, constraint: StructuredOutput) -> Any:
        return await self._in_pool(self.matcher, constraint)

    async def _in_pool(self, fn: Any, constraint: StructuredOutput) -> Any:
        context = contextvars.copy_context()  # record() reaches the request's log line from the pool
        return await asyncio.get_running_loop().run_in_executor(self.executor, context.run, fn, constraint)

    def _cached(self, constraint: StructuredOutput) -> Any:
        with self._lock:
            if constraint in self._cache:
                self._cache.move_to_end(constraint)
                record(grammar_cache="hit")
                return self._cache[constraint]
            return None

    def compile(self, constraint: StructuredOutput) -> Any:
        """The compiled grammar of ``constraint`` (cached; requests with the same new one wait for its one
        compile); a constraint xgrammar refuses is a 400."""
        if (hit := self._cached(constraint)) is not None:
            return hit
        with self._lock:
            gate = self._compiling.setdefault(constraint, threading.Lock())
        with gate:
            if (hit := self._cached(constraint)) is not None:
                return hit
            try:
                return self._compile_and_keep(constraint)
            finally:
                with self._lock:
                    self._compiling.pop(constraint, None)

    def _compile_and_keep(self, constraint: StructuredOutput) -> Any:
        started = time.perf_counter()
        try:
            compiler = self.compiler
        except Exception as exc:  # xgrammar missing or broken: this server's fault, not the schema's
            raise engine_failure(exc, "the grammar compiler could not start") from exc
        try:
            compiled = self._compile(compiler, constraint)
        except (RuntimeError, ValueError) as exc:  # xgrammar's refusal of a schema it cannot express
            raise InvalidRequest(f"the schema cannot be compiled to a grammar: {str(exc)[:300]}",
                                 param="schema", code="invalid_schema") from None
        seconds = time.perf_counter() - started
        record(grammar_cache="miss", grammar_compile_ms=round(seconds * 1000, 2))
        with self._lock:
            self._cache[constraint] = compiled
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        return compiled

    def _compile(self, compiler: Any, constraint: StructuredOutput) -> Any:
        import xgrammar as xgr

        # Compact JSON, as vLLM's disable_any_whitespace: no whitespace between tokens to loop in.
        if constraint.json_schema is not None:
            return compiler.compile_json_schema(constraint.json_schema, any_whitespace=False, separators=(",", ":"))
        if constraint.json_object:
            return compiler.compile_json_schema('{"type": "object"}', any_whitespace=False, separators=(",", ":"))
        choices = " | ".join(_ebnf_string(c) for c in constraint.choice)
        return compiler.compile_grammar(xgr.Grammar.from_ebnf(f"root ::= {choices}"))

    def matcher(self, constraint: StructuredOutput) -> Any:
        import xgrammar as xgr

        compiled = self.compile(constraint)
        try:
            return xgr.GrammarMatcher(compiled)
        except Exception as exc:  # the compiled grammar was fine: the matcher is the fault
            raise engine_failure(exc, "the grammar matcher could not start") from exc


def _ebnf_string(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r")
    return f'"{escaped}"'
