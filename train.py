"""Train a GPT-2 or LLaMA-style model with the MARS family or a baseline. See `python train.py --help`.

    python train.py                                          # tiny GPT-2, embedded corpus, MARS-AdamW, CPU
    python train.py model=llama_tiny                         # the same with a tiny LLaMA (docs/llama.md)
    torchrun --nproc_per_node=8 train.py experiment=paper/owt_small_mars

The work happens in mars.train.cli (also installed as the `mars-train` command).
"""

from mars.train.cli import main

if __name__ == "__main__":
    main()
