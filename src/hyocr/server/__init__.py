"""How hyocr is served: uvicorn's options and protocol classes (uvicorn.py), and the launcher of several
API processes sharing one vLLM engine core (processes.py). Above api/ (it builds the app) and engines/."""
