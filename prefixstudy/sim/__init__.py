"""Stage: sim (beside ``model/``).  Predicts what cannot be measured by running vLLM's own V1
scheduler and block pool in virtual time, with a step-cost model fitted to measured engine steps.

``vllm_setup`` builds the scheduler as EngineCore does; ``driver`` runs it step by step; the
step-cost model it prices steps with is fitted and transferred in ``costmodel``; ``sessions`` replays a
study config (reset, prime, warm-up, the arrival schedule) into the results layout of a real run.
vLLM is imported lazily, inside functions: this package imports without it.
"""
