"""The replay: what an agent stores (spec), the replay schedule, the store protocol and its
stores (device frame store, Reverb frame replay, an agent's own tables, host transitions), the
store plan, and every Reverb internal in one seam.

One room of the house, below the agent interface (`magi_lp.agent`) and above placement:

    spec               the contract with an agent (`FrameReplaySpec`, `TransitionReplaySpec`,
                       `WriteAbandonedError`): no JAX, no Reverb
    schedule           when learning starts and the replay ratio (`ReplaySchedule`,
                       `RatioGate`): one pure rule both runners share
    store              the store protocol (`ReplayStore`, `LearnerReplay`)
    stores/            the stores, and `resolve_store` (`replay.store` -> one store object)
    plan               whether the device store fits the learner (`replay.store`='auto')
    frame_window       a batch of transitions as windows of unique frames
    frame_store        the device store: frames on the learner's device(s)
    step_queue         actors' steps to the device store: the items, the drain, and the
                       served step queue (no Reverb)
    frame_queue        the Reverb queue that carries actors' steps to the device store
    frame_replay       the Reverb frame replay: table, adder, dataset
    transition_replay  a state agent's n-step transitions in host memory
    transition_table   the same, served by the replay node with a Reverb table's rules
    reverb_seam        every dm-reverb internal it relies on, and what breaks if it changes

A frame's path, store 'device', distributed: the actor's `QueueFrameAdder` (frame_queue)
writes the step into the replay node's queue; the learner's `QueueDrainer` takes it
(reverb_seam's sampler) into its `DeviceFrameStore` (frame_store), whose
`DeviceReplayIterator` hands the update a `FrameTransition` (frame_window) batch. Without
Reverb (transport 'served'), `ServedFrameAdder` and `StepDrainer` (step_queue) carry it
through the replay node's `StepQueue` instead.
"""
