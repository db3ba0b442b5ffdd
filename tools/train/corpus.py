"""The training corpus: the King James Bible as Debian's bible-kjv package prints it.

Each chapter becomes one document, its verses on their own lines with the references
("Ge1:1") stripped. Every VALIDATION_EVERY-th chapter is held out for validation.
"""

import re
import subprocess

BIBLE_COMMAND = ["bible", "-f", "gen1:1-rev22:21"]
VERSE_LINE = re.compile(r"^([1-3]?[A-Za-z]+)(\d+):(\d+) (.*)$")
VALIDATION_EVERY = 20


def read_chapters():
    """Chapters in canonical order, each the text of its verses joined by newlines."""
    output = subprocess.run(BIBLE_COMMAND, check=True, capture_output=True, text=True).stdout
    chapters = []
    current_key = None
    for line in output.splitlines():
        match = VERSE_LINE.match(line)
        if match is None:
            raise ValueError(f"unexpected line from bible: {line!r}")
        book, chapter, _verse, text = match.groups()
        if (book, chapter) != current_key:
            chapters.append([])
            current_key = (book, chapter)
        chapters[-1].append(text.strip())
    return ["\n".join(verses) for verses in chapters]


def split_chapters(chapters):
    """(training chapters, validation chapters), a fixed interleaved split."""
    training = [c for i, c in enumerate(chapters) if i % VALIDATION_EVERY != VALIDATION_EVERY - 1]
    validation = [c for i, c in enumerate(chapters) if i % VALIDATION_EVERY == VALIDATION_EVERY - 1]
    return training, validation
