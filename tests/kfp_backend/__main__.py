import sys

from tests.kfp_backend import main

sys.exit(main())
