"""Continuous batching for the lean backend: a running batch of at most `max_running` rows, each prompt's
group handed out the moment its last response ends, waiting prompts admitted into the freed rows.

The loop, once per generated token: admit waiting prompts while their `n` rows fit (one prefill for
all admitted together, its KV cache merged into the running one, `DecodeState.merge`); sample a token
for every running row; take the rows that ended (end-of-sequence token, stop string, `max_new_tokens`)
out of the batch; yield the groups all of whose rows have ended; decode one step for the rest.

Seeding: prompt p draws from a generator of its own, seeded with `seeds[p]`, which fills a
(n, max_new_tokens) table of uniforms when the prompt is admitted; row j of p samples its t-th token by
inverting the cumulative distribution at `u[j, t]`. A row's draws therefore depend on its prompt's
seed and on its own logits only, not on which other rows share the batch, on `max_running` or on
the order of admission: the same seeds give the same responses (to float rounding of the logits,
which the batch's shape can move in the last bits). These are not the chunked path's draws (one
`torch.multinomial` over the whole chunk, as HF), so the two modes sample different responses from
the same seed; greedy decoding gives the same tokens in both.

Interruptible (`InFlight`, `inflight.py`): before each decoding step the stream polls for new weights.
Rows in flight continue under them, and every token records the version of the weights that computed
its logits beside its log-prob (`Response.versions`). The KV cache of a row's context was computed with
the old weights; it is not kept: after an update the running rows' contexts (prompt and tokens so far)
run again in one prefill under the new weights. AReaL keeps the old cache instead (cheaper: no prefill
per update), but then a token is sampled from neither policy, and its recorded log-prob is no policy's
log-prob of it given its context. Here a token of version v is a sample of pi_v given its whole context,
so its log-prob is exactly the behaviour policy's that the decoupled objective divides by. The price is
one prefill of the running batch per update, small beside the decoding steps between updates.
Closing the stream early pauses it: the rows of the prompts not yet handed out go into
`InFlight.paused`; given back in `InFlight.started` they continue from their tokens (a row samples its
t-th token at `u[j, t]` whether or not it was paused, so a pause under unchanged weights changes nothing).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from m2flow.backends.generation.base import SamplingParams, text_before_stop
from m2flow.backends.generation.inflight import InFlight, PartialResponse
from m2flow.backends.generation.sampling import inverse_cdf_sample, warp_logits
from m2flow.data.batch import Response, ResponseGroup, left_pad
from m2flow.models.functional_lm import DecodeState, KVPrefix

Backend = Any
"""The `LeanGenerationBackend` whose decoder, tokenizer and cuts the loop uses (not imported: it imports this)."""

__all__ = ["InFlight", "PartialResponse", "inverse_cdf_sample", "stream_groups"]


def stream_groups(backend: Backend, prompt_ids: Sequence[Sequence[int]], params: SamplingParams,
                  seeds: Sequence[int], max_running: int, prefixes: Sequence[KVPrefix | None] | None = None,
                  keep: dict[int, KVPrefix] | None = None, flight: InFlight | None = None,
                  ) -> Iterator[list[ResponseGroup]]:
    """The groups of `prompt_ids` (prompt_index = position in it), yielded in batches as they finish.

    `prefixes[p]`: cached keys and values of tokens prompt p begins with (the part that serves is used,
    the rest of the prompt runs). `keep`: filled, for every row g = p * n + j as it ends, with the cache of
    the tokens it ran (the prompt and all its tokens but the last), to continue it later. `flight`: weight
    updates polled between decoding steps, rows begun by an earlier stream, and, when the stream is closed
    early, the rows it leaves unfinished (`inflight.py`). Prompts admitted together with a started one run
    their whole contexts (prompt and tokens so far) in one prefill, without `prefixes`."""
    n, steps, device = params.n, params.max_new_tokens, backend.device
    if len(seeds) != len(prompt_ids):
        raise ValueError(f"one seed per prompt: {len(seeds)} seeds for {len(prompt_ids)} prompts")
    if prefixes is not None and len(prefixes) != len(prompt_ids):
        raise ValueError(f"one prefix (or None) per prompt: {len(prefixes)} for {len(prompt_ids)} prompts")
    if max_running < n:
        raise ValueError(f"max_running ({max_running}) must hold one group of n={n} rows")
    started = flight.started if flight is not None else None
    if started is not None and len(started) != len(prompt_ids):
        raise ValueError(f"one list of started rows (or None) per prompt: {len(started)} for {len(prompt_ids)} prompts")
    greedy = params.temperature == 0
    temperature = 1.0 if greedy else params.temperature  # the recorded policy's (see the hf backend)
    total = len(prompt_ids) * n
    # Global row g = p * n + j (sample j of prompt p), prompt-major as in the chunked path.
    generated = torch.full((total, steps), backend.pad_id, dtype=torch.long)
    logprobs = torch.zeros(total, steps)
    version = flight.version if flight is not None else 0
    versions = torch.zeros(total, steps, dtype=torch.long)  # the weight version each token was sampled with
    stopped_at = [0] * total
    ended_at = [0] * total  # tokens each row had sampled when it ended
    left = [n] * len(prompt_ids)  # rows of each prompt still running
    admitted: list[int] = []
    eos = torch.tensor(backend.eos_ids, device=device)
    waiting = deque(range(len(prompt_ids)))
    state: DecodeState | None = None
    logits = torch.empty(0, device=device)
    rows = torch.empty(0, dtype=torch.long)  # (B,) global row of each running row
    made = torch.empty(0, dtype=torch.long)  # (B,) tokens each running row has sampled
    draws = torch.empty(0, steps)  # (B, T) each running row's uniforms
    pending = torch.empty(0, dtype=torch.long, device=device)  # (B,) the last tokens sampled, not run yet
    try:
        while waiting or len(rows):
            update = flight.poll() if flight is not None and flight.poll is not None else None
            if update is not None:
                version = update
                flight.updates += 1
            if len(rows):
                if update is None:
                    logits = backend.decoder.decode(pending, state)
                else:
                    # New weights: the running rows' contexts run again under them (their KV cache was
                    # computed with the old ones), so each next token is a sample of the new policy given
                    # its whole context, and its log-prob is exactly that policy's.
                    contexts = [[*prompt_ids[g // n], *generated[g, :t].tolist()]
                                for g, t in zip(rows.tolist(), made.tolist())]
                    logits, state = _prefill_rows(backend, contexts, steps)
            admit = []
            while waiting and len(rows) + (len(admit) + 1) * n <= max_running:
                admit.append(waiting.popleft())
            finished: list[int] = []
            if admit:
                admitted.extend(admit)
                resumed = started is not None and any(started[p] is not None for p in admit)
                if resumed:
                    assert started is not None
                    new_rows, contexts = [], []
                    for p in admit:
                        going = _resume(p, started[p], n, generated, logprobs, versions, stopped_at, ended_at)
                        new_rows += going
                        contexts += [[*prompt_ids[p], *generated[g, :k].tolist()] for g, k in going]
                        left[p] = len(going)
                        if not left[p]:
                            finished.append(p)
                    new_logits, new_state = _prefill_rows(backend, contexts, steps) if contexts else (None, None)
                    add_rows = torch.tensor([g for g, _ in new_rows], dtype=torch.long)
                    add_made = torch.tensor([k for _, k in new_rows], dtype=torch.long)
                else:
                    cached: list[KVPrefix | None] = []
                    if prefixes is not None:
                        if backend.decoder.stale:  # refreshed here, so that cached keys of other weights are seen as such
                            backend.decoder.refresh()
                        cached = [_serving(prefixes[p], prompt_ids[p], backend.decoder.builds) for p in admit]
                    if not any(c is not None for c in cached):
                        cached = []
                    ids, mask = left_pad([prompt_ids[p][len(c.ids) if c is not None else 0:]
                                          for p, c in zip(admit, cached or [None] * len(admit))], backend.pad_id)
                    new_logits, new_state = _prefill(backend, ids, mask, steps, n, cached or None)
                    add_rows = torch.tensor([p * n + j for p in admit for j in range(n)], dtype=torch.long)
                    add_made = torch.zeros(len(admit) * n, dtype=torch.long)
                if new_state is not None:
                    if state is None:
                        state = new_state
                    else:
                        state.trim()
                        state = DecodeState.merge(state, new_state, steps)
                    logits = torch.cat((logits, new_logits)) if len(logits) else new_logits
                    rows, made = torch.cat((rows, add_rows)), torch.cat((made, add_made))
                    if not greedy:
                        tables = {p: torch.rand(n, steps, generator=torch.Generator().manual_seed(int(seeds[p])))
                                  for p in admit}
                        draws = torch.cat((draws, *(tables[g // n][g % n][None] for g in add_rows.tolist())))
            if not len(rows):  # every admitted row had ended before (a resumed group handed out whole)
                if finished:
                    yield _groups(backend, prompt_ids, sorted(finished), params, generated, logprobs, versions,
                                  stopped_at, ended_at)
                continue
            assert state is not None
            scores = logits.float()
            if greedy:
                token = scores.argmax(-1)
            else:
                u = draws.gather(1, made[:, None]).squeeze(1).to(device)
                token = inverse_cdf_sample(torch.softmax(warp_logits(scores, params), dim=-1), u)
            policy = torch.log_softmax(scores / temperature if temperature != 1.0 else scores, dim=-1)
            token_lp = policy.gather(-1, token[:, None]).squeeze(-1)
            generated[rows, made] = token.cpu()
            logprobs[rows, made] = token_lp.float().cpu()
            versions[rows, made] = version  # every logit of this step was computed with these weights
            made += 1
            ended = torch.isin(token, eos).cpu() | (made >= steps)
            if params.stop:
                ended |= _stopped(backend, params.stop, generated, rows, made, stopped_at)
            done = ended.nonzero().squeeze(1).tolist()  # the rows that ended (most steps: none)
            if done:
                all_rows, all_made = rows.tolist(), made.tolist()
                for i in done:
                    g, t = all_rows[i], all_made[i]
                    if keep is not None:
                        keep[g] = state.row_prefix(i, [*prompt_ids[g // n], *generated[g, : t - 1].tolist()],
                                                   backend.decoder.builds)
                    ended_at[g] = t
                    p = g // n
                    left[p] -= 1
                    if not left[p]:
                        finished.append(p)
            if finished:
                yield _groups(backend, prompt_ids, sorted(finished), params, generated, logprobs, versions,
                              stopped_at, ended_at)
            if len(done) == len(rows):
                state, logits = None, torch.empty(0, device=device)
                rows, made, draws = rows[:0], made[:0], draws[:0]
                continue
            if done:
                going = (~ended).nonzero().squeeze(1)
                state.select(going.to(device))
                rows, made, draws, token = rows[going], made[going], draws[going] if len(draws) else draws, \
                    token[going.to(device)]
            pending = token
    except GeneratorExit:  # closed early: hand the unfinished rows to the caller
        if flight is not None:
            going = dict(zip(rows.tolist(), made.tolist()))
            for p in admitted:
                if left[p]:
                    flight.paused[p] = [_partial(backend, g, going, generated, logprobs, versions, stopped_at,
                                                 ended_at) for g in range(p * n, (p + 1) * n)]
        raise


def _prefill_rows(backend: Backend, contexts: list[list[int]], steps: int) -> tuple[torch.Tensor, DecodeState]:
    """The decoder's prefill of one context per row (a prompt and the tokens its row sampled so far)."""
    ids, mask = left_pad(contexts, backend.pad_id)
    return backend.decoder.prefill(ids.to(backend.device), mask.to(backend.device), steps)


def _resume(p: int, rows: list[PartialResponse] | None, n: int, generated: torch.Tensor, logprobs: torch.Tensor,
            versions: torch.Tensor, stopped_at: list[int], ended_at: list[int]) -> list[tuple[int, int]]:
    """Put prompt ``p``'s started rows (None: none started) in the tables; (row g, tokens it has) of each row
    still to run. A row that had ended is recorded as ended and does not run."""
    if rows is None:
        return [(p * n + j, 0) for j in range(n)]
    if len(rows) != n:
        raise ValueError(f"prompt {p}: {len(rows)} started rows, not n={n}")
    going = []
    for j, r in enumerate(rows):
        g, k = p * n + j, len(r.token_ids)
        if k >= generated.shape[1] and r.finish_reason is None:
            raise ValueError(f"row {g}: {k} tokens and still going, with max_new_tokens {generated.shape[1]}")
        generated[g, :k] = torch.tensor(r.token_ids, dtype=torch.long)
        logprobs[g, :k] = torch.tensor(r.logprobs)
        versions[g, :k] = torch.tensor(r.versions, dtype=torch.long)
        if r.finish_reason is None:
            going.append((g, k))
        else:
            ended_at[g] = k
            stopped_at[g] = k if r.finish_reason == "stop" else 0
    return going


def _partial(backend: Backend, g: int, going: dict[int, int], generated: torch.Tensor, logprobs: torch.Tensor,
             versions: torch.Tensor, stopped_at: list[int], ended_at: list[int]) -> PartialResponse:
    """Row ``g`` as it stands: still going (``going[g]`` tokens), or ended at ``ended_at[g]`` tokens."""
    k = going[g] if g in going and not ended_at[g] else ended_at[g]
    kept = generated[g, :k].tolist()
    reason = None
    if ended_at[g]:
        reason = "stop" if (kept and kept[-1] in backend.eos_ids) or 0 < stopped_at[g] <= k else "length"
    return PartialResponse(kept, logprobs[g, :k].tolist(), versions[g, :k].tolist(), reason)


def _prefill(backend: Backend, ids: torch.Tensor, mask: torch.Tensor, steps: int, n: int,
             prefixes: list[KVPrefix | None] | None) -> tuple[torch.Tensor, DecodeState]:
    """The decoder's prefill of left-padded prompts (P, L), each for ``n`` rows; prompts that are the same
    (the episodes of one group at their first turn) run once and their rows are copied."""
    device = backend.device
    if prefixes is None and len(ids) > 1:
        first: dict[tuple[int, ...], int] = {}  # a prompt (ids and mask) -> its place among the distinct ones
        unique: list[int] = []  # the row of each distinct prompt's first occurrence
        index = []  # each row's distinct prompt
        for r, row in enumerate(torch.cat((ids, mask), 1).tolist()):
            key = tuple(row)
            if key not in first:
                first[key] = len(unique)
                unique.append(r)
            index.append(first[key])
        if len(unique) < len(index):
            logits, state = backend.decoder.prefill(ids[unique].to(device), mask[unique].to(device), steps, repeats=n)
            rows = torch.tensor([i * n + j for i in index for j in range(n)], device=device)
            state.select(rows)
            return logits.index_select(0, rows), state
    return backend.decoder.prefill(ids.to(device), mask.to(device), steps, repeats=n, prefixes=prefixes)


def _serving(prefix: KVPrefix | None, ids: Sequence[int], build: int) -> KVPrefix | None:
    """The part of ``prefix`` that ``ids`` begins with (leaving its last token to run), or None (also when
    it was computed with other weights than ``build``'s)."""
    if prefix is None or prefix.build != build:
        return None
    usable = prefix.usable(ids)
    if usable == len(prefix.ids):
        return prefix
    if usable == 0:
        return None
    return KVPrefix(prefix.keys[:, :, :usable], prefix.values[:, :, :usable], prefix.ids[:usable], build)


def _stopped(backend: Backend, stops: Sequence[str], generated: torch.Tensor, rows: torch.Tensor,
             made: torch.Tensor, stopped_at: list[int]) -> torch.Tensor:
    """(B,) whether each running row's text now holds a stop string; records the token count where it did."""
    tail = 4 * max(len(s) for s in stops) + 4  # as `_StopStrings`: enough tokens for the longest stop string
    pieces = [generated[g, max(0, t - tail) : t].tolist() for g, t in zip(rows.tolist(), made.tolist())]
    texts = backend.tokenizer.batch_decode(pieces, skip_special_tokens=True)
    out = torch.zeros(len(texts), dtype=torch.bool)
    for i, (g, t, text) in enumerate(zip(rows.tolist(), made.tolist(), texts)):
        if any(s in text for s in stops):
            stopped_at[g] = t
            out[i] = True
    return out


def _groups(backend: Backend, prompt_ids: Sequence[Sequence[int]], finished: list[int], params: SamplingParams,
            generated: torch.Tensor, logprobs: torch.Tensor, versions: torch.Tensor, stopped_at: list[int],
            ended_at: list[int]) -> list[ResponseGroup]:
    """The groups of the prompts ``finished``, every row cut where it ended (its end-of-sequence token, the token
    that completed a stop string, or its last allowed token), the texts decoded in one call."""
    n, eos = params.n, set(backend.eos_ids)
    rows = [g for p in finished for g in range(p * n, (p + 1) * n)]
    tokens = [generated[g, : ended_at[g]].tolist() for g in rows]
    texts = backend.tokenizer.batch_decode(tokens, skip_special_tokens=True)
    responses = []
    for g, kept, text in zip(rows, tokens, texts):
        stop = bool(kept) and kept[-1] in eos or 0 < stopped_at[g] <= len(kept)
        responses.append(Response(token_ids=kept, logprobs=logprobs[g, : len(kept)].tolist(),
                                  finish_reason="stop" if stop else "length", text=text_before_stop(text, params.stop),
                                  versions=versions[g, : len(kept)].tolist()))
    return [ResponseGroup(prompt_index=p, prompt_ids=list(prompt_ids[p]), responses=responses[i * n : (i + 1) * n])
            for i, p in enumerate(finished)]
