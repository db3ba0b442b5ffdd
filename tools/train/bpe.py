"""Byte-level BPE: trains merges on a corpus and writes a Hugging Face tokenizer.json.

The pre-tokenizer is GPT-2's regex over the GPT-2 byte-to-unicode alphabet, the same one the
`ByteLevel` pre-tokenizer of tokenizer.json applies, so ids computed here for training data are
the ids the server's tokenizer produces for the same text.
"""

import collections
import heapq
import json

import regex

GPT2_SPLIT_PATTERN = regex.compile(
    r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
)


def bytes_to_unicode():
    """GPT-2's reversible map from the 256 byte values to printable unicode characters."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    codepoints = printable[:]
    num_shifted = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            codepoints.append(256 + num_shifted)
            num_shifted += 1
    return {byte: chr(cp) for byte, cp in zip(printable, codepoints)}


BYTE_TO_UNICODE = bytes_to_unicode()


def pre_tokenize(text):
    """Splits text into GPT-2 pre-tokens, each spelled in the byte-to-unicode alphabet."""
    return [
        "".join(BYTE_TO_UNICODE[b] for b in piece.encode("utf-8"))
        for piece in GPT2_SPLIT_PATTERN.findall(text)
    ]


def train_merges(texts, num_new_tokens):
    """Learns merges, most frequent pair first, until they spell num_new_tokens distinct
    tokens; ties go to the smaller pair so the result depends on the corpus alone."""
    word_counts = collections.Counter()
    for text in texts:
        word_counts.update(pre_tokenize(text))
    words = [list(word) for word in word_counts]
    counts = list(word_counts.values())

    pair_counts = collections.Counter()
    pair_word_ids = collections.defaultdict(set)
    for word_id, symbols in enumerate(words):
        for pair in zip(symbols, symbols[1:]):
            pair_counts[pair] += counts[word_id]
            pair_word_ids[pair].add(word_id)
    heap = [(-count, pair) for pair, count in pair_counts.items()]
    heapq.heapify(heap)

    merges = []
    new_tokens = set()
    while len(new_tokens) < num_new_tokens and heap:
        neg_count, pair = heapq.heappop(heap)
        if pair_counts.get(pair, 0) != -neg_count:
            continue  # stale entry; the current count was pushed separately
        if -neg_count < 2:
            break
        merges.append(pair)
        merged = pair[0] + pair[1]
        new_tokens.add(merged)
        touched_pairs = set()
        for word_id in sorted(pair_word_ids.pop(pair)):
            symbols = words[word_id]
            count = counts[word_id]
            for old_pair in zip(symbols, symbols[1:]):
                pair_counts[old_pair] -= count
                touched_pairs.add(old_pair)
            new_symbols = []
            i = 0
            while i < len(symbols):
                if i + 1 < len(symbols) and (symbols[i], symbols[i + 1]) == pair:
                    new_symbols.append(merged)
                    i += 2
                else:
                    new_symbols.append(symbols[i])
                    i += 1
            words[word_id] = new_symbols
            for new_pair in zip(new_symbols, new_symbols[1:]):
                pair_counts[new_pair] += count
                pair_word_ids[new_pair].add(word_id)
                touched_pairs.add(new_pair)
        pair_counts.pop(pair, None)
        for touched in touched_pairs:
            if touched != pair and pair_counts.get(touched, 0) > 0:
                heapq.heappush(heap, (-pair_counts[touched], touched))
    return merges


class ByteLevelBpe:
    """Encodes and decodes with a fixed vocabulary: 256 byte symbols, then one token per merge,
    then the special tokens."""

    def __init__(self, merges, special_tokens):
        self.merges = [tuple(m) for m in merges]
        self.merge_ranks = {pair: rank for rank, pair in enumerate(self.merges)}
        self.vocab = {}
        for byte in range(256):
            self.vocab[BYTE_TO_UNICODE[byte]] = len(self.vocab)
        for left, right in self.merges:
            self.vocab.setdefault(left + right, len(self.vocab))
        self.special_tokens = {}
        for token in special_tokens:
            self.special_tokens[token] = len(self.vocab) + len(self.special_tokens)
        self.id_to_token = {i: t for t, i in self.vocab.items()}
        self.unicode_to_byte = {u: b for b, u in BYTE_TO_UNICODE.items()}
        self._word_cache = {}

    @property
    def vocab_size(self):
        return len(self.vocab) + len(self.special_tokens)

    def _encode_word(self, word):
        cached = self._word_cache.get(word)
        if cached is not None:
            return cached
        symbols = list(word)
        while len(symbols) > 1:
            ranked = [
                (self.merge_ranks.get(pair, len(self.merge_ranks)), i)
                for i, pair in enumerate(zip(symbols, symbols[1:]))
            ]
            rank, i = min(ranked)
            if rank == len(self.merge_ranks):
                break
            symbols[i : i + 2] = [symbols[i] + symbols[i + 1]]
        ids = [self.vocab[s] for s in symbols]
        self._word_cache[word] = ids
        return ids

    def encode(self, text):
        """Ids of plain text; special-token strings inside it are not recognised."""
        ids = []
        for word in pre_tokenize(text):
            ids.extend(self._encode_word(word))
        return ids

    def decode(self, ids):
        special_by_id = {i: t for t, i in self.special_tokens.items()}
        out = bytearray()
        for token_id in ids:
            if token_id in special_by_id:
                out.extend(special_by_id[token_id].encode("utf-8"))
            else:
                out.extend(self.unicode_to_byte[c] for c in self.id_to_token[token_id])
        return out.decode("utf-8", errors="replace")

    def to_tokenizer_json(self):
        """The tokenizer.json that `tokenizers` (Rust and JS) loads for this vocabulary."""
        byte_level = {"add_prefix_space": False, "trim_offsets": True, "use_regex": True}
        return {
            "version": "1.0",
            "truncation": None,
            "padding": None,
            "added_tokens": [
                {
                    "id": token_id,
                    "content": token,
                    "single_word": False,
                    "lstrip": False,
                    "rstrip": False,
                    "normalized": False,
                    "special": True,
                }
                for token, token_id in self.special_tokens.items()
            ],
            "normalizer": None,
            "pre_tokenizer": {"type": "ByteLevel", **byte_level},
            "post_processor": {"type": "ByteLevel", **byte_level, "trim_offsets": False},
            "decoder": {"type": "ByteLevel", **byte_level},
            "model": {
                "type": "BPE",
                "dropout": None,
                "unk_token": None,
                "continuing_subword_prefix": None,
                "end_of_word_suffix": None,
                "fuse_unk": False,
                "byte_fallback": False,
                "ignore_merges": False,
                "vocab": self.vocab,
                "merges": [[left, right] for left, right in self.merges],
            },
        }

    @classmethod
    def from_tokenizer_json(cls, tokenizer_json):
        special_tokens = [t["content"] for t in sorted(tokenizer_json["added_tokens"], key=lambda t: t["id"])]
        return cls(tokenizer_json["model"]["merges"], special_tokens)


def save_tokenizer_json(tokenizer, path):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(tokenizer.to_tokenizer_json(), f, ensure_ascii=False, indent=1)
        f.write("\n")


def load_tokenizer_json(path):
    with open(path, encoding="utf-8") as f:
        return ByteLevelBpe.from_tokenizer_json(json.load(f))
