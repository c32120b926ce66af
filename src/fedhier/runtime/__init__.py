from .simulate import RoundFailed, RoundRecord, SimulationResult, simulate

__all__ = ["simulate", "SimulationResult", "RoundRecord", "RoundFailed"]
