"""Code a config may name for import (`[experimental] custom_import`): importing it writes
"ran" to the file $BOOST_TITAN_TEST_PAYLOAD, so a test can tell that it never ran."""

import os
from pathlib import Path

if os.environ.get("BOOST_TITAN_TEST_PAYLOAD"):
    Path(os.environ["BOOST_TITAN_TEST_PAYLOAD"]).write_text("ran")
