import sys

from tests.control_plane import main

sys.exit(main())
