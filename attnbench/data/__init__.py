"""Corpora shipped with attnbench, each pinned by the SHA-256 of its decompressed bytes (README.md here)."""
from __future__ import annotations

import gzip
import hashlib
from dataclasses import dataclass
from importlib.resources import files


@dataclass(frozen=True)
class ShippedCorpus:
    name: str
    file: str
    sha256: str  # of the decompressed bytes
    licence: str

    def read(self) -> bytes:
        """The decompressed bytes, checked against the pinned hash (a changed file is an error, not a silent drift)."""
        data = gzip.decompress((files("attnbench.data") / self.file).read_bytes())
        digest = hashlib.sha256(data).hexdigest()
        if digest != self.sha256:
            raise ValueError(f"corpus {self.name!r}: SHA-256 {digest} does not match the pinned {self.sha256}; "
                             f"the shipped file {self.file} was changed (see attnbench/data/README.md)")
        return data


CORPORA = {
    "shakespeare": ShippedCorpus(
        name="shakespeare", file="shakespeare.txt.gz",
        sha256="04decea0dd965df5e6cfc4a538b0c62623aaa3bfd848ac7fad6734e59c96624d",
        licence="public domain (Globe Edition 1866 via the Open Shakespeare project, CC BY 2.5 attribution)"),
}
