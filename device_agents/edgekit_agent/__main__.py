"""``python3 -m edgekit_agent`` (from the source tree) runs the agent's command line."""

from .cli import entry

entry()
