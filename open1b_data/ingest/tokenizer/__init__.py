"""The mix's tokenizer: byte-level BPE trained from scratch, and an exact fast encoder -
one noun per module: the training ``sample``, BPE ``training`` (and its saved and
transformers forms), the fast ``encoder``. The names below are the ingest's public ones."""
from open1b_data.ingest.tokenizer.encoder import (ENCODER_ENV, LOOKAHEAD_TAIL,  # noqa: F401
                                                  FastEncoder, check_equivalence,
                                                  delegated_pattern, native_encoder)
from open1b_data.ingest.tokenizer.sample import (TrainingSample, select_sample,  # noqa: F401
                                                 source_quotas)
from open1b_data.ingest.tokenizer.training import (HF_DIRECTORY, load_tokenizer,  # noqa: F401
                                                   save_tokenizer, train_tokenizer,
                                                   transformers_files)
