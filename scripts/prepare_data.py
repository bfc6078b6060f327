#!/usr/bin/env python
"""Tokenize a dataset into uint16 shards: python scripts/prepare_data.py data=NAME [data.KEY=VALUE ...]

Sources: embedded (default), openwebtext, fineweb_edu, local. See configs/data/*.yaml.
"""

from mars.data.cli import main

if __name__ == "__main__":
    main()
