import sys

from gpulens.gpucheck.run import main

sys.exit(main())
