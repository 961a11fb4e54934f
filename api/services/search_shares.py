"""Each client's share of the search pool: no client, keyed or anonymous, can hold the whole pool.

A client is its API key when the request carried a valid one, else its address. A request that searches
(a plan, the advice of a refused batch, the dashboard's batch hint) is admitted while its client has
fewer than `share` such requests in progress in this web process; past that it waits up to `wait_s`
seconds for one of them to end, then is refused with 429, a `Retry-After` header and a problem that
says why. With two search processes the share is one: however many searches one client sends, the
other process stays free for everybody else's small plans.

The count lives on the event loop (a waiting request holds no thread, no database connection): no lock,
since nothing awaits between reading a count and raising it.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio

from api.problems import ProblemError


class SearchShares:
    """Admission of searching requests, per client (one instance per web process)."""

    def __init__(self, *, share: int, wait_s: float, retry_after_s: int) -> None:
        self.share = share
        self.wait_s = wait_s
        self.retry_after_s = retry_after_s
        self._held: dict[str, int] = {}
        self._released: dict[str, anyio.Event] = {}
        """Per client with requests waiting: set when one of its searches ends."""

    def in_progress(self, client: str) -> int:
        """The client's searching requests in progress now."""
        return self._held.get(client, 0)

    @asynccontextmanager
    async def held(self, client: str, *, described: str) -> AsyncIterator[None]:
        """Hold one of `client`'s share for the block (`described`: the client in the refusal's words).

        Raises a 429 ProblemError when the share stays full for `wait_s` seconds."""
        deadline = time.monotonic() + self.wait_s
        while self._held.get(client, 0) >= self.share:
            # Woken by the client's next release (every waiter; one takes the room, the others wait again).
            released = self._released.setdefault(client, anyio.Event())
            with anyio.move_on_after(max(0.0, deadline - time.monotonic())):
                await released.wait()
            if self._held.get(client, 0) >= self.share and time.monotonic() >= deadline:
                raise self._refusal(described)
        self._held[client] = self._held.get(client, 0) + 1
        try:
            yield
        finally:
            left = self._held[client] - 1
            if left:
                self._held[client] = left
            else:
                del self._held[client]  # the table holds only clients with searches in progress
            waiting = self._released.pop(client, None)
            if waiting is not None:
                waiting.set()

    def _refusal(self, described: str) -> ProblemError:
        searches, which = ("search", "it") if self.share == 1 else ("searches", "one")
        return ProblemError(
            429, f"{described} already has {self.share} {searches} in progress, its share of this server's "
            f"search processes; wait for {which} to finish and send this request again (after "
            f"Retry-After: {self.retry_after_s} s)",
            slug="search-share-exhausted", title="Too many searches from this client",
            headers={"Retry-After": str(self.retry_after_s)}, share=self.share,
        )
