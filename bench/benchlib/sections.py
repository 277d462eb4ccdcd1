"""The Suite: one method per section, run by main() in SECTIONS order."""
from .sections_latency import LatencySections
from .sections_resources import ResourcesSection
from .sections_restart import RestartSection
from .sections_throughput import ThroughputSections

SECTIONS = ["durable", "interval", "ack", "e2e", "restart", "resources"]


class Suite(ThroughputSections, LatencySections, RestartSection, ResourcesSection):
    """durable, interval (sections_throughput), ack, e2e (sections_latency),
    restart (sections_restart), resources (sections_resources); each prints
    its table and keeps its figures in self.out[section]."""
