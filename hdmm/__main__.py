"""``python -m hdmm``: the command line (:mod:`hdmm.cli`). Also a script Spark can submit:
``spark-submit --master spark://head:7077 "$(python -c 'import hdmm.__main__ as m; print(m.__file__)')" release ...``
(so its imports are absolute)."""

import sys

from hdmm.cli import main

if __name__ == "__main__":
    sys.exit(main())
