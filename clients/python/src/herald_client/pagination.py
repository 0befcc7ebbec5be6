"""Cursor-paginated lists as lazy iterators: `for event in herald.events.list(): ...`.

Herald's lists answer `{"data": [...], "next_cursor": "…" | null}`, newest first; the next page is
asked for with `?cursor=`. A `ListIterator` fetches one page at a time, only when the items of the
previous one are used up, so breaking out of the loop early costs no further call.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")

Fetch = Callable[[Mapping[str, Any]], Any]


@dataclass(frozen=True)
class Page(Generic[T]):
    """One page of a list: its items and the cursor of the next page (None on the last)."""

    data: list[T]
    next_cursor: str | None


class ListIterator(Generic[T]):
    """The items of a list, newest first, across as many pages as it has.

    `limit` is the page size (at most 100; Herald's default when None). Start from `cursor` to go on
    where an earlier iteration stopped (`iterator.cursor` is the cursor of the next page not yet
    fetched, None once the last page was read). `pages()` iterates page by page instead.
    """

    def __init__(self, fetch: Fetch, params: Mapping[str, Any], *, limit: int | None = None,
                 cursor: str | None = None) -> None:
        self._fetch = fetch
        self._params = dict(params)
        self._limit = limit
        self.cursor = cursor
        self._done = False
        self._buffer: Iterator[T] = iter(())

    def page(self) -> Page[T] | None:
        """Fetch the next page (None when there is none left) and move the cursor past it."""
        if self._done:
            return None
        body = self._fetch({**self._params, "cursor": self.cursor, "limit": self._limit})
        page: Page[T] = Page(list(body["data"]), body.get("next_cursor"))
        self.cursor = page.next_cursor
        self._done = page.next_cursor is None
        return page

    def pages(self) -> Iterator[Page[T]]:
        """The remaining pages, one call each."""
        while (page := self.page()) is not None:
            yield page

    def __iter__(self) -> Iterator[T]:
        return self

    def __next__(self) -> T:
        while True:
            item = next(self._buffer, _END)
            if item is not _END:
                return item
            page = self.page()
            if page is None:
                raise StopIteration
            self._buffer = iter(page.data)


_END: Any = object()
