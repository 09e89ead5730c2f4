"""Fault diagnosis: the flight recorder's rank side (flight_watch) and controller side (flight_gather),
torch's own dumps (torch_fr) laid beside partui's (fr_merge), the verdict (doctor), and a hang under torchrun
(torchrun_watch)."""
