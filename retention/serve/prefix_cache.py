"""An automatic prefix cache: values (the engine's Snapshots) kept per token prefix, in a trie of blocks, under a
byte budget with least-recently-used eviction.

A prefix is a whole number of blocks (`block` tokens each): the trie's node at depth k is the prefix of k blocks,
its children keyed by the next block's tokens, so `longest` walks a prompt block by block and returns the deepest
node holding a value. Eviction is LRU over the entries: an entry is used when `put` stores it and when `longest`
returns it, and so are the cached prefixes above it (a shared system prompt's entries stay as recently used as the
sessions continuing past them, so a session's deeper entries are evicted before the prefix they share); storing
one past the budget evicts the least recently used until it fits, and an entry larger than the whole budget is not
stored. A node left with no value and no children is pruned, so the trie holds only paths to entries. The cache is
owned by one model: `claim` with another owner (the engine passes its config and weights digest) drops every entry
first, so a value made by another model is never returned.
Pure Python: what a value is and how its bytes are counted is the caller's (prefix_prefill.py).
"""

import collections
import dataclasses
from collections.abc import Hashable, Sequence

from retention.validation import check_int


@dataclasses.dataclass(frozen=True)
class PrefixCacheStats:
    """What a prefix cache did and holds.

    Attributes:
        hits: lookups that found a cached prefix.
        misses: lookups that found none.
        tokens_reused: the tokens of the prefixes found (not prefilled again).
        entries: the prefixes held.
        bytes_held: their bytes, <= budget_bytes.
        budget_bytes: the byte budget (0: the cache is off).
        block: the tokens of a block; every prefix held is a whole number of blocks.
        evictions: entries dropped to make room (not counting those dropped by `clear` or a new owner).
    """

    hits: int
    misses: int
    tokens_reused: int
    entries: int
    bytes_held: int
    budget_bytes: int
    block: int
    evictions: int


class _Node:
    """A trie node: the prefix of `depth` blocks; `value` and `nbytes` when the prefix is cached."""

    __slots__ = ("parent", "key", "depth", "children", "value", "nbytes")

    def __init__(self, parent: "_Node | None", key: tuple[int, ...] | None, depth: int):
        self.parent, self.key, self.depth = parent, key, depth
        self.children: dict[tuple[int, ...], _Node] = {}
        self.value, self.nbytes = None, 0


class PrefixCache:
    """Values kept per token prefix of whole blocks, under a byte budget, least recently used evicted first.

    Args:
        budget_bytes: the most bytes held; 0 turns the cache off (nothing is stored, every lookup misses).
        block: the tokens of a block (>= 1): prefixes of k * block tokens are kept.

    Raises:
        ValueError: naming the argument, its value and what is allowed.
    """

    def __init__(self, budget_bytes: int, block: int):
        check_int("prefix_cache_bytes", budget_bytes, low=0)
        check_int("prefix_block", block)
        self.budget_bytes, self.block = int(budget_bytes), int(block)
        self.owner: Hashable | None = None
        self._root = _Node(None, None, 0)
        self._lru: collections.OrderedDict[int, _Node] = collections.OrderedDict()  # id(node) -> node, oldest first
        self._bytes = self._hits = self._misses = self._reused = self._evictions = 0

    @property
    def enabled(self) -> bool:
        """Whether the budget holds anything (budget_bytes > 0)."""
        return self.budget_bytes > 0

    def claim(self, owner: Hashable) -> None:
        """Make `owner` (the model whose values are stored) this cache's: another owner than the last drops every
        entry first.

        Args:
            owner: equal for values that may be shared (e.g. the model's config and weights digest).
        """
        if owner != self.owner:
            self.clear()
            self.owner = owner

    def clear(self) -> None:
        """Drop every entry (the counts of hits, misses and evictions are kept)."""
        self._root = _Node(None, None, 0)
        self._lru.clear()
        self._bytes = 0

    def _blocks(self, tokens: Sequence[int], k: int) -> list[tuple[int, ...]]:
        b = self.block
        return [tuple(int(t) for t in tokens[i * b : (i + 1) * b]) for i in range(k)]

    def longest(self, tokens: Sequence[int]) -> tuple[int, object]:
        """The longest cached prefix of `tokens` (whole blocks), marked used with the cached prefixes above it (they
        before it: it is the most recently used); counted as a hit or a miss.

        Args:
            tokens: the prompt's ids.

        Returns:
            (its tokens k * block, its value), or (0, None) when no prefix is cached.
        """
        node, found = self._root, None
        for key in self._blocks(tokens, len(tokens) // self.block):
            node = node.children.get(key)
            if node is None:
                break
            if node.value is not None:
                found = node
        if found is None:
            self._misses += 1
            return 0, None
        path, above = [], found
        while above is not None:
            path.append(above)
            above = above.parent
        for used in reversed(path):  # the shortest first, the prefix returned last
            if used.value is not None:
                self._lru.move_to_end(id(used))
        self._hits += 1
        self._reused += found.depth * self.block
        return found.depth * self.block, found.value

    def fits(self, nbytes: int) -> bool:
        """Whether a value of `nbytes` can be stored (after evicting others).

        Args:
            nbytes: the value's bytes.

        Returns:
            0 < nbytes <= budget_bytes.
        """
        return 0 < nbytes <= self.budget_bytes

    def put(self, tokens: Sequence[int], value, nbytes: int) -> bool:
        """Store `value` as the prefix `tokens` (a whole number of blocks), replacing one stored there, evicting the
        least recently used entries until it fits; a value larger than the budget is not stored.

        Args:
            tokens: the prefix's ids, len a multiple of block (>= 1 block).
            value: what to keep.
            nbytes: its bytes.

        Returns:
            Whether it was stored.

        Raises:
            ValueError: the prefix is not a whole number of blocks.
        """
        if len(tokens) == 0 or len(tokens) % self.block:
            raise ValueError(f"a cached prefix must be k * block={self.block} tokens (k >= 1), got {len(tokens)}")
        if not self.fits(nbytes):
            return False
        node = self._path(tokens)
        if node.value is not None:
            self._drop(node)
        while self._bytes + nbytes > self.budget_bytes:
            self._evict_oldest()
        node = self._path(tokens)  # again: pruning after an eviction may have removed it
        node.value, node.nbytes = value, nbytes
        self._lru[id(node)] = node
        self._bytes += nbytes
        return True

    def _path(self, tokens: Sequence[int]) -> _Node:
        """The node of the prefix `tokens`, made (with the nodes above it) when missing."""
        node = self._root
        for key in self._blocks(tokens, len(tokens) // self.block):
            node = node.children.setdefault(key, _Node(node, key, node.depth + 1))
        return node

    def _evict_oldest(self) -> None:
        _, node = self._lru.popitem(last=False)
        self._evictions += 1
        self._drop(node, listed=False)

    def _drop(self, node: _Node, *, listed: bool = True) -> None:
        """Remove node's value (from the LRU order too when `listed`) and prune the nodes left empty above it."""
        if listed:
            del self._lru[id(node)]
        self._bytes -= node.nbytes
        node.value, node.nbytes = None, 0
        while node.parent is not None and node.value is None and not node.children:
            del node.parent.children[node.key]
            node = node.parent

    def stats(self) -> PrefixCacheStats:
        """The counts so far and what is held now.

        Returns:
            The PrefixCacheStats.
        """
        return PrefixCacheStats(
            hits=self._hits,
            misses=self._misses,
            tokens_reused=self._reused,
            entries=len(self._lru),
            bytes_held=self._bytes,
            budget_bytes=self.budget_bytes,
            block=self.block,
            evictions=self._evictions,
        )

    def prefixes(self) -> list[int]:
        """The cached prefixes' lengths in tokens, least recently used first (for tests and inspection).

        Returns:
            k * block for each entry.
        """
        return [node.depth * self.block for node in self._lru.values()]
