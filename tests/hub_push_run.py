"""Train the tiny Voting run and push it with the trainer's own `push_to_hub`, through huggingface_hub's client, to
whatever `HF_ENDPOINT` names (tests/local_hub.py in the tests). Run as a script, so that the endpoint is read when
huggingface_hub is imported:

    python tests/hub_push_run.py MODEL_DIR OUTPUT_DIR MAX_STEPS [CHECKPOINT_TO_RESUME]
"""

import sys

from tiny import random_answers, tiny_trainer

if __name__ == "__main__":
    model_dir, output_dir, max_steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    resume = sys.argv[4] if len(sys.argv) > 4 else None
    trainer = tiny_trainer(
        model_dir,
        output_dir,
        respond=random_answers,
        hub_model_id="me/voting-toy",
        max_steps=max_steps,
        save_steps=2,
        logging_steps=1,
        learning_rate=5e-2,
        policy_sharing="isolated",
    )
    trainer.train(resume_from_checkpoint=resume)
    print(trainer.push_to_hub())
