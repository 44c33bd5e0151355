"""``python -m laplacianformer.detection {train,eval,predict} ...`` = ``laplacianformer detect ...`` (docs/DETECTION.md)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
