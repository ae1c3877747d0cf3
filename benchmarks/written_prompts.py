"""Eight openings of everyday Python that is not in the shipped pair's corpus (the standard library), written for
bench_pair: what a person trying the studio would type. The target's greedy continuations of them show whether it
writes text or loops (their distinct-4-gram rate), and the drafter's tau on them whether it has learnt more than the
corpus' own files."""
from __future__ import annotations

WRITTEN_PROMPTS = (
    # a Flask route
    'from flask import Flask, abort, jsonify\n\napp = Flask(__name__)\n\n\n@app.route("/api/users/<int:user_id>")\n'
    "def get_user(user_id):\n    user = USERS.get(user_id)\n    if user is None:\n",
    # a numpy snippet
    "import numpy as np\n\n\ndef normalize_rows(matrix: np.ndarray) -> np.ndarray:\n"
    '    """Scale every row of matrix to unit length."""\n    norms = np.linalg.norm(matrix, axis=1, keepdims=True)\n',
    # a pytest test
    "import pytest\n\nfrom shop.cart import Cart, Item\n\n\n@pytest.fixture\ndef cart():\n    return Cart()\n\n\n"
    "def test_adding_an_item_updates_the_total(cart):\n",
    # an argparse main
    "import argparse\nimport sys\n\n\ndef main(argv=None):\n"
    '    parser = argparse.ArgumentParser(description="Resize every image in a folder.")\n'
    '    parser.add_argument("folder", help="the folder to read")\n',
    # a pandas aggregation
    'import pandas as pd\n\n\ndef monthly_sales(path):\n    df = pd.read_csv(path, parse_dates=["date"])\n'
    '    df["month"] = df["date"].dt.to_period("M")\n',
    # an HTTP client with a dataclass
    "from dataclasses import dataclass\n\nimport requests\n\n\n@dataclass\nclass Repo:\n    name: str\n    stars: int\n"
    "\n\ndef fetch_repos(user: str) -> list[Repo]:\n",
    # a torch module
    "import torch\nfrom torch import nn\n\n\nclass MLP(nn.Module):\n    def __init__(self, dim: int, hidden: int):\n"
    "        super().__init__()\n",
    # an SQLAlchemy model
    "from sqlalchemy import Column, ForeignKey, Integer, String\nfrom sqlalchemy.orm import declarative_base, "
    'relationship\n\nBase = declarative_base()\n\n\nclass Author(Base):\n    __tablename__ = "authors"\n\n',
)
