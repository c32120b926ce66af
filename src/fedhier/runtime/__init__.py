from .simulate import RoundFailed, RoundRecord, SimulationResult, SiteFailedWarning, simulate

__all__ = ["simulate", "SimulationResult", "RoundRecord", "RoundFailed", "SiteFailedWarning"]
