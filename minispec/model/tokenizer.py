"""The byte-level tokenizer of the embedded models: token id = byte value, 256 ids, no specials."""

from __future__ import annotations


class ByteTokenizer:
    """Encodes text as its UTF-8 bytes; the subset of a Hugging Face tokenizer the lessons use."""

    vocab_size = 256
    eos_token_id = None
    bos_token_id = None
    pad_token_id = None

    def __len__(self) -> int:
        return self.vocab_size

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")

    def batch_decode(self, batch, skip_special_tokens: bool = False) -> list[str]:
        return [self.decode(ids) for ids in batch]

    def convert_ids_to_tokens(self, ids) -> list[str]:
        return [bytes([int(i)]).decode("latin-1") for i in ids]

    def __call__(self, text: str | list[str]) -> dict:
        ids = [self.encode(t) for t in text] if isinstance(text, list) else self.encode(text)
        return {"input_ids": ids}

    def __repr__(self) -> str:
        return "ByteTokenizer(vocab_size=256)"
