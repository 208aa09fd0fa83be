"""An automatic prefix cache: values (the engine's Snapshots) kept per token prefix, in a trie of blocks, under a
byte budget with least-recently-used eviction.

A prefix is a whole number of blocks (`block` tokens each): the trie's node at depth k is the prefix of k blocks,
its children keyed by the next block's tokens, so `longest` walks a prompt block by block and returns the deepest
node holding a value. Eviction is LRU over the entries: an entry is used when `put` stores it and when `longest`
returns it, and so are the cached prefixes above it (a shared system prompt's entries stay as recently used as the
sessions continuing past them, so a session's deeper entries are evicted before the prefix they share); storing
one past the budget evicts the least recently used until it fits, and an entry larger than the whole budget is not
stored. An entry stored `chained` holds only what its last block added (a growing cache's keys and values:
prefix_blocks.py) and needs every prefix above it: it is stored only below a cached parent, and an entry with a
chained child is never evicted (the least recently used of the others is: leaves first), so `chain` always finds
every block of a cached prefix. A node left with no value and no children is pruned, so the trie holds only paths
to entries. The cache is owned by one model: `claim` with another owner (the engine passes its config and weights
digest) drops every entry first, so a value made by another model is never returned.
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

    __slots__ = ("parent", "key", "depth", "children", "value", "nbytes", "chained")

    def __init__(self, parent: "_Node | None", key: tuple[int, ...] | None, depth: int):
        self.parent, self.key, self.depth = parent, key, depth
        self.children: dict[tuple[int, ...], _Node] = {}
        self.value, self.nbytes, self.chained = None, 0, False

    def needed(self) -> bool:
        """Whether a chained child holds a value (that needs this node's)."""
        return any(c.chained and c.value is not None for c in self.children.values())

    def above(self) -> list["_Node"]:
        """The nodes of the shorter prefixes that hold values, the shortest first."""
        nodes, node = [], self.parent
        while node is not None:
            if node.value is not None:
                nodes.append(node)
            node = node.parent
        return nodes[::-1]


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
        for used in [*found.above(), found]:  # the shortest first, the prefix returned last
            self._lru.move_to_end(id(used))
        self._hits += 1
        self._reused += found.depth * self.block
        return found.depth * self.block, found.value

    def chain(self, tokens: Sequence[int]) -> list:
        """The values of the cached prefixes of `tokens` (whole blocks), the shortest first; counts nothing and
        changes no order (`longest` did). For a chained entry's prefix: every block's value, none missing.

        Args:
            tokens: a cached prefix's ids (len a multiple of block).

        Returns:
            The values, one per cached prefix.
        """
        node, values = self._root, []
        for key in self._blocks(tokens, len(tokens) // self.block):
            node = node.children.get(key)
            if node is None:
                break
            if node.value is not None:
                values.append(node.value)
        return values

    def fits(self, nbytes: int) -> bool:
        """Whether a value of `nbytes` can be stored (after evicting others).

        Args:
            nbytes: the value's bytes.

        Returns:
            0 < nbytes <= budget_bytes.
        """
        return 0 < nbytes <= self.budget_bytes

    def put(self, tokens: Sequence[int], value, nbytes: int, *, chained: bool = False) -> bool:
        """Store `value` as the prefix `tokens` (a whole number of blocks), replacing one stored there (and the
        chained entries below it), evicting the least recently used entries no chained entry needs until it fits; a
        value larger than the budget is not stored.

        Args:
            tokens: the prefix's ids, len a multiple of block (>= 1 block).
            value: what to keep.
            nbytes: its bytes.
            chained: the value needs the values of the shorter prefixes (it holds what its last block added): not
                stored when the prefix one block shorter is not cached, or when it and the prefixes above it do not
                fit the budget together; they are not evicted while it is held.

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
        keep = node.above() if chained else []
        parent_missing = chained and node.depth > 1 and node.parent.value is None
        if parent_missing or sum(n.nbytes for n in keep) + nbytes > self.budget_bytes:
            self._prune(node)
            return False
        kept = {id(n) for n in keep}
        while self._bytes + nbytes > self.budget_bytes:
            self._evict_oldest(kept)
        node = self._path(tokens)  # again: pruning after an eviction may have removed it
        node.value, node.nbytes, node.chained = value, nbytes, chained
        self._lru[id(node)] = node
        self._bytes += nbytes
        return True

    def _path(self, tokens: Sequence[int]) -> _Node:
        """The node of the prefix `tokens`, made (with the nodes above it) when missing."""
        node = self._root
        for key in self._blocks(tokens, len(tokens) // self.block):
            node = node.children.setdefault(key, _Node(node, key, node.depth + 1))
        return node

    def _evict_oldest(self, kept: set[int]) -> None:
        """Drop the least recently used entry that no chained entry needs, other than those of `kept` (ids)."""
        node = next(n for i, n in self._lru.items() if i not in kept and not n.needed())
        self._evictions += 1
        self._drop(node)

    def _drop(self, node: _Node) -> None:
        """Remove node's value and its chained children's (theirs first), and prune the nodes left empty above it."""
        for child in list(node.children.values()):
            if child.chained and child.value is not None:
                self._drop(child)
        del self._lru[id(node)]
        self._bytes -= node.nbytes
        node.value, node.nbytes, node.chained = None, 0, False
        self._prune(node)

    def _prune(self, node: _Node) -> None:
        """Remove node and the nodes above it while they hold no value and have no children."""
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
