"""A synthetic library (members, checkouts, public catalog) shaped like Tumult Analytics'
tutorial data (``library-members.csv``, ``checkout-logs.csv``, ``library_books.csv`` of
opendp/tumult-demo-data), generated deterministically for the query corpus.

Test data only: drawn with NumPy's seeded generator, never used as noise.
"""

from __future__ import annotations

import csv
import datetime as dt
from pathlib import Path

import numpy as np

GENDERS = ("female", "male", "nonbinary", "unspecified")
EDUCATION = ("up-to-high-school", "high-school-diploma", "bachelors-associate", "masters-degree",
             "doctorate-professional")
GENRES = ("Mystery/thriller/crime", "History", "Biographies/memoirs", "Romance", "Cookbooks/food writing",
          "Science fiction", "Fantasy", "Classics/Literature", "Health/wellness", "Religion/spirituality",
          "Self-help", "True crime", "Political", "Current affairs", "Graphic novels", "Business",
          "Poetry", "Westerns")
FICTION = {"Mystery/thriller/crime", "Romance", "Science fiction", "Fantasy", "Classics/Literature",
           "Graphic novels", "Poetry", "Westerns"}
#: Declared ranges (the fixture policy's bounds; the data stays inside them).
AGE_RANGE = (5, 99)
BOOKS_BORROWED_MAX = 200
JOINED = (dt.date(2012, 1, 1), dt.date(2024, 12, 31))
CHECKOUTS = (dt.date(2022, 1, 1), dt.date(2024, 12, 31))
MAX_CHECKOUTS_PER_MEMBER = 30
BOOKS = 300


def write_library(out: Path, *, members: int = 1500, seed: int = 2024) -> dict[str, Path]:
    """Write ``members.csv``, ``checkouts.csv``, ``books.csv`` and ``genres.csv`` under ``out``.

    Deterministic for a given ``(members, seed)``. Returns name → path.
    """
    rng = np.random.default_rng(seed)
    out.mkdir(parents=True, exist_ok=True)
    paths = {name: out / f"{name}.csv" for name in ("members", "checkouts", "books", "genres")}

    with paths["genres"].open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["genre", "category"])
        for g in GENRES:
            w.writerow([g, "fiction" if g in FICTION else "nonfiction"])

    book_genre = rng.integers(0, len(GENRES), BOOKS)
    isbns = [f"978{100000000 + 7919 * i:010d}"[:13] for i in range(BOOKS)]
    with paths["books"].open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["isbn", "title", "author", "genre", "publication_year"])
        for i in range(BOOKS):
            w.writerow([isbns[i], f"Title {i:03d}", f"Author {i % 97:02d}", GENRES[book_genre[i]],
                        int(rng.integers(1950, 2024))])

    span_joined = (JOINED[1] - JOINED[0]).days
    span_checkout = (CHECKOUTS[1] - CHECKOUTS[0]).days
    with paths["members"].open("w", newline="") as fm, paths["checkouts"].open("w", newline="") as fc:
        wm, wc = csv.writer(fm), csv.writer(fc)
        wm.writerow(["id", "name", "age", "gender", "education_level", "zip_code", "books_borrowed",
                     "favorite_genres", "date_joined"])
        wc.writerow(["checkout_date", "member_id", "title", "author", "isbn", "genre"])
        for mid in range(1, members + 1):
            age = int(rng.integers(AGE_RANGE[0], AGE_RANGE[1] + 1))
            edu = EDUCATION[min(4, max(0, int(rng.normal(1.5 + (age > 22) + (age > 30) * 0.5, 1.0))))]
            favs = ";".join(GENRES[j] for j in rng.choice(len(GENRES), int(rng.integers(1, 4)), replace=False))
            joined = JOINED[0] + dt.timedelta(days=int(rng.integers(0, span_joined + 1)))
            n = int(min(MAX_CHECKOUTS_PER_MEMBER, rng.geometric(0.12) - 1))
            wm.writerow([mid, f"Member {mid}", age, GENDERS[int(rng.choice(4, p=[0.48, 0.45, 0.04, 0.03]))], edu,
                         f"27{int(rng.integers(500, 700)):03d}", n * 3 + int(rng.integers(0, 60)), favs,
                         joined.isoformat()])
            for _ in range(n):
                b = int(rng.integers(0, BOOKS))
                day = CHECKOUTS[0] + dt.timedelta(days=int(rng.integers(0, span_checkout + 1)))
                wc.writerow([day.isoformat(), mid, f"Title {b:03d}", f"Author {b % 97:02d}", isbns[b],
                             GENRES[book_genre[b]]])
    return paths
