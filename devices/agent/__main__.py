"""`python -m devices.agent` is `kiln-agent`."""

import sys

from devices.agent.cli import main

sys.exit(main())
