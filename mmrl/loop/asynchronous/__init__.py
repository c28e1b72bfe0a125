"""Asynchronous RL on Ray: rollout workers sample step batches with the newest weights they were sent while the
learner trains, under a bound on how many policy versions old a trained action may be.

    mmrl/config/asynchronous.py   the `asynchronous:` section, its checks, the staleness rules (pace, drop)
    worker.py      `RolloutWorker`: a Ray actor holding a policy copy, a reward set and the records
    controller.py  `Controller`: plans step batches, hands them to the workers under the bound, pushes weights;
                   the synchronous trainer's loop (`mmrl.loop.trainer.Run.fit`) drives it as its generator
    launch.py      `start`: Ray up, the resources checked, the rollout and reward workers built, the controller
    learners.py    the learner's processes as Ray actors in a placement group
    follower.py    each learner process's side of a step batch (its share, the advantages)
"""
