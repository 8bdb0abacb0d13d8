"""MetaWorld tasks as pixel-and-language gymnasium envs: a camera image, the task's instruction, proprio.

Optional: needs the ``metaworld`` package (the ``metaworld`` extra) and an offscreen OpenGL:
EGL (Mesa's software renderer works) or OSMesa. Select with ``EnvConfig(backend="metaworld",
env_id="reach-v3")``; any of MetaWorld's 50 v3 tasks has an instruction (``instructions.py``), and
``env_kwargs.instruction`` gives a task its sentence instead. ``env_id`` may also list tasks
(``"reach-v3,push-v3"``) or name a family (``"mt3"``, ``"mt10"``, ``"mt50"``): env ``i`` of the
vector then runs task ``i mod len(tasks)``, and the policy tells them apart by the instruction
alone. ``env_kwargs`` go to :class:`MetaWorldPixelEnv`.

Each step renders one frame (``step_without_render`` skips it, for the actions inside a chunk whose
next observation no policy reads) with the scene's expensive effects off (no multisampling, shadows,
reflections or skybox): at 64x64 that is ~150-180 steps/s in one process in the software renderer,
against 6-13 with the defaults. The "corner" camera's image comes out upside down (its up axis
points at the floor); it is rotated 180 degrees. Resets draw the object and goal positions from
the env's own seeded stream: ``reset(seed=s)`` starts the stream at ``s``, so an episode is a pure
function of its seed and the actions. Training envs are seeded ``config.seed + index``;
:func:`held_out_seeds` gives seeds from a disjoint range for evaluation.
"""

from __future__ import annotations

import atexit
import ctypes.util
import hashlib
import importlib.util
import inspect
import logging
import os
import threading
import weakref
from typing import Any, Literal

import gymnasium as gym
import numpy as np

from m2flow.config.errors import InputError
from m2flow.envs.instructions import MT10, MT50, WordTokenizer
from m2flow.envs.instructions import instruction as instruction_of
from m2flow.envs.packed import PackedLayout

logger = logging.getLogger(__name__)

TASK_FAMILIES: dict[str, list[str]] = {
    "mt3": ["reach-v3", "push-v3", "pick-place-v3"],
    "mt10": list(MT10),
    "mt50": list(MT50),
}
"""Names for task lists; ``mt10`` and ``mt50`` are MetaWorld's MT10 and MT50 sets."""

FLIPPED_CAMERAS = frozenset({"corner"})
"""Cameras whose image MetaWorld's scene renders upside down."""

HELD_OUT_SEED_BASE = 1_000_000
"""Evaluation seeds start here, far above any training env's ``config.seed + index``."""

PROPRIO_DIM = 4
"""Proprioception: the end-effector position (3) and the gripper opening (1)."""


def held_out_seeds(n: int, offset: int = 0) -> list[int]:
    """``n`` evaluation seeds disjoint from the training seeds."""
    return [HELD_OUT_SEED_BASE + offset + i for i in range(n)]


def expand_tasks(env_id: str, given: str | None = None) -> list[str]:
    """``env_id`` as a task list: a family name, a comma-separated list, or one task (``metaworld/`` optional).

    ``given``: the user's instruction (``env_kwargs.instruction``), for one task only; without it
    every task must have one in the table. Problems raise InputError naming the key.
    """
    name = env_id.removeprefix("metaworld/")
    if name in TASK_FAMILIES:
        tasks = list(TASK_FAMILIES[name])
    else:
        tasks = [t.strip().removeprefix("metaworld/") for t in name.split(",") if t.strip()]
    if not tasks:
        raise InputError("env.env_id: names no MetaWorld task")
    if given is not None and len(tasks) > 1:
        raise InputError(f"env.env_kwargs.instruction: one sentence for {len(tasks)} tasks; give it for a single "
                         "task (a task list uses the instruction table)")
    for task in tasks:
        instruction_of(task, given)  # raises for a task without an instruction
    return tasks


def gl_backend() -> str | None:
    """The offscreen OpenGL to use: ``MUJOCO_GL`` when it names egl/osmesa, else egl, else osmesa, else None."""
    wanted = os.environ.get("MUJOCO_GL", "").lower()
    if wanted in ("egl", "osmesa"):
        return wanted
    if ctypes.util.find_library("EGL"):
        return "egl"
    if ctypes.util.find_library("OSMesa"):
        return "osmesa"
    return None


def metaworld_unavailable_reason() -> str | None:
    """Why MetaWorld pixel envs cannot be built here, or None when they can."""
    if importlib.util.find_spec("metaworld") is None:
        return "the metaworld package is not installed (pip install -e '.[metaworld]')"
    if importlib.util.find_spec("OpenGL") is None:
        return "PyOpenGL is not installed"
    if gl_backend() is None:
        return "no offscreen OpenGL: neither libEGL nor libOSMesa is installed"
    return None


_THREAD = threading.local()
"""``contexts``: the render contexts made in this thread, by their scene's assets (see ``_RenderContext``)."""
_LIVE_CONTEXTS: weakref.WeakSet[_RenderContext] = weakref.WeakSet()
_exit_hook = False
_ASSET_PREFIXES = ("tex_", "mesh_", "hfield_", "skin_", "flex_")
"""The ``MjModel`` arrays a render context uploads (textures, meshes, height fields, skins, flexes)."""


def _close_contexts() -> None:
    for context in list(_LIVE_CONTEXTS):
        context.free()


def _thread_contexts() -> dict[str, _RenderContext]:
    contexts = getattr(_THREAD, "contexts", None)
    if contexts is None:
        contexts = _THREAD.contexts = {}
    return contexts


def _asset_key(model: Any) -> str:
    """What a render context depends on: the model's asset arrays and its offscreen buffer's settings.

    MetaWorld's resets move bodies, sites and geoms, which a scene reads from the env's own model at each
    render; nothing of that is uploaded into the context."""
    digest = hashlib.blake2b(digest_size=16)
    for name in sorted(n for n in dir(model) if n.startswith(_ASSET_PREFIXES)):
        value = getattr(model, name)
        if isinstance(value, np.ndarray):
            digest.update(f"{name}{value.shape}{value.dtype}".encode())
            digest.update(np.ascontiguousarray(value).tobytes())
    vis = model.vis
    digest.update(repr((vis.global_.offwidth, vis.global_.offheight, vis.quality.offsamples,
                        vis.quality.shadowsize)).encode())
    return digest.hexdigest()


class _RenderContext:
    """An offscreen OpenGL context and MuJoCo's render context in it, shared by every camera of this process
    whose model has the same assets, in the thread that made it.

    Making MuJoCo's render context uploads the scene's textures and meshes: ~0.3 s in a software renderer
    for a MetaWorld scene (a 1024x1024 texture among them), paid per env of a vector at start-up before it was
    shared. Each camera keeps its own scene, filled from its own env's model and data at each render. An OpenGL
    context is current in one thread at a time, so each thread has contexts of its own (workers run as threads
    of one process in the in-process executor) and a camera renders in the thread that built it, as before the
    contexts were shared: no lock is needed.
    """

    def __init__(self, model: Any, key: str) -> None:
        import mujoco

        backend = gl_backend()
        if backend == "egl":
            from mujoco.egl import GLContext
        elif backend == "osmesa":
            from mujoco.osmesa import GLContext
        else:
            raise RuntimeError("no offscreen OpenGL: neither libEGL nor libOSMesa is installed")
        self.key, self.users, self.pid = key, 0, os.getpid()
        self.registry = _thread_contexts()
        self.gl: Any = GLContext(model.vis.global_.offwidth, model.vis.global_.offheight)
        global _exit_hook
        if not _exit_hook:
            # Registered after the first context, so it runs before the GL display's own exit hook:
            # contexts freed after the display is gone raise at interpreter exit.
            atexit.register(_close_contexts)
            _exit_hook = True
        self.gl.make_current()
        # The smallest font: no text is ever drawn on these frames, and the larger fonts' glyph textures
        # made a context ~4x slower to create.
        self.mjr = mujoco.MjrContext(model, mujoco.mjtFontScale.mjFONTSCALE_50)
        mujoco.mjr_setBuffer(mujoco.mjtFramebuffer.mjFB_OFFSCREEN, self.mjr)
        _LIVE_CONTEXTS.add(self)

    @classmethod
    def acquire(cls, model: Any) -> _RenderContext:
        """The context for ``model``'s assets, made on first use; the caller releases it once."""
        key, contexts = _asset_key(model), _thread_contexts()
        context = contexts.get(key)
        if context is None or context.pid != os.getpid():  # a forked child inherits the parent's, unusable here
            context = contexts[key] = cls(model, key)
        context.users += 1
        return context

    def release(self) -> None:
        self.users -= 1
        if self.users <= 0:
            self.free()

    def free(self) -> None:
        if self.registry.get(self.key) is self:
            del self.registry[self.key]
        _LIVE_CONTEXTS.discard(self)
        if self.gl is not None:
            try:
                self.gl.make_current()
            except Exception:  # noqa: BLE001 - current in another thread: one that built envs and ended
                # without closing them (freed at exit). The context's GL objects go with it.
                logger.debug("render context %s: current in another thread; destroyed without freeing its "
                             "objects first", self.key, exc_info=True)
            else:
                self.mjr.free()
            self.gl.free()
            self.gl = None


class OffscreenCamera:
    """Renders one named camera of a MuJoCo model into (H, W, 3) uint8 images with cheap settings.

    Not ``mujoco.Renderer``: that takes its OpenGL backend from ``MUJOCO_GL`` as it was when
    ``mujoco`` was first imported (often by gymnasium, before any env asked for pixels); here the
    EGL or OSMesa context is made explicitly, whatever was imported first. Cameras of one process
    whose models have the same assets render through one context (``_RenderContext``).
    """

    def __init__(self, model: Any, camera: str, height: int, width: int, rotate: bool, fast: bool = True) -> None:
        import mujoco

        self._mj = mujoco
        self.height, self.width, self.rotate = height, width, rotate
        cam_id = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_CAMERA, camera)
        if cam_id < 0:
            names = [model.camera(i).name for i in range(model.ncam)]
            raise ValueError(f"camera: {camera!r} is not in the scene; valid: {names}")
        if fast:  # multisampling is read when the render context is made: off before it exists
            model.vis.quality.offsamples = 0
        model.vis.global_.offwidth = max(model.vis.global_.offwidth, width)
        model.vis.global_.offheight = max(model.vis.global_.offheight, height)
        self._shared: _RenderContext | None = _RenderContext.acquire(model)
        self._scene = mujoco.MjvScene(model, maxgeom=1000)
        if fast:  # in a software renderer shadows and reflections are extra passes over the scene
            for flag in (mujoco.mjtRndFlag.mjRND_SHADOW, mujoco.mjtRndFlag.mjRND_REFLECTION, mujoco.mjtRndFlag.mjRND_SKYBOX):
                self._scene.flags[flag] = 0
        self._option = mujoco.MjvOption()
        self._camera = mujoco.MjvCamera()
        self._camera.type = mujoco.mjtCamera.mjCAMERA_FIXED
        self._camera.fixedcamid = cam_id
        self._viewport = mujoco.MjrRect(0, 0, width, height)
        self._pixels = np.empty((height, width, 3), dtype=np.uint8)
        self._model = model

    def render(self, data: Any) -> np.ndarray:
        """A new (H, W, 3) uint8 image of the camera's view of ``data``."""
        mj, shared = self._mj, self._shared
        if shared is None:
            raise RuntimeError("the camera is closed")
        shared.gl.make_current()
        mj.mjv_updateScene(self._model, data, self._option, None, self._camera, mj.mjtCatBit.mjCAT_ALL, self._scene)
        mj.mjr_render(self._viewport, self._scene, shared.mjr)
        mj.mjr_readPixels(self._pixels, None, self._viewport, shared.mjr)
        # OpenGL rows run bottom-up: flip them; a camera mounted upside down also needs a left-right flip.
        return self._pixels[:, ::-1].copy() if self.rotate else self._pixels[::-1].copy()

    def close(self) -> None:
        if self._shared is not None:
            self._shared.release()
            self._shared = None


def _check_available() -> None:
    reason = metaworld_unavailable_reason()
    if reason is not None:
        raise RuntimeError(f"backend: 'metaworld' is unavailable: {reason}")


def _check_observation(observation: str) -> None:
    if observation not in ("packed", "image"):
        raise ValueError(f"observation: must be 'packed' or 'image', got {observation!r}")


def _layout(height: int, width: int, text_len: int, proprio: bool) -> PackedLayout:
    return PackedLayout(height, width, 3, text_len, PROPRIO_DIM if proprio else 0)


def _spaces(layout: PackedLayout, observation: str) -> tuple[gym.spaces.Box, gym.spaces.Box]:
    """(observation, action) spaces: packed bytes or the image alone; 4 actions in [-1, 1]."""
    shape = (layout.height, layout.width, layout.channels) if observation == "image" else (layout.size,)
    return gym.spaces.Box(0, 255, shape, dtype=np.uint8), gym.spaces.Box(-1.0, 1.0, (4,), dtype=np.float32)


def pixel_env_spaces(task: str, **kwargs: Any) -> tuple[gym.spaces.Box, gym.spaces.Box]:
    """The (observation, action) spaces of ``MetaWorldPixelEnv(task, **kwargs)`` without building it (no scene
    compile, no render context); an argument the constructor does not take raises TypeError as it would."""
    _check_available()
    args = inspect.signature(MetaWorldPixelEnv.__init__).bind(None, task, **kwargs)
    args.apply_defaults()  # the constructor's own defaults, the one source of them
    a = args.arguments
    _check_observation(a["observation"])
    return _spaces(_layout(a["height"], a["width"], a["text_len"], a["proprio"]), a["observation"])


class MetaWorldPixelEnv(gym.Env):
    """One MetaWorld task: packed (image, instruction ids, proprio) uint8 observations, ``success`` in info.

    The observation layout is ``self.layout`` (:class:`~m2flow.envs.packed.PackedLayout`); the
    39-dimensional MetaWorld state of the last step is ``self.state`` (for scripted experts).
    ``reward``: ``"success"`` gives 1 on the step the task is solved and 0 otherwise; ``"dense"``
    MetaWorld's shaped reward divided by 10 (in [0, 1]). With ``terminate_on_success`` the episode
    ends (terminated) at the first success; it is truncated after ``max_episode_steps`` in any case.
    ``success_bonus`` (with ``terminate_on_success``) adds to the success step's reward what the steps
    left would pay at most (one per step: the most a step pays in either mode), so ending an episode
    at success is never worth less than staying in the solved state until the time limit.
    ``fast_render=False`` keeps the scene's multisampling, shadows, reflections and skybox (nicer
    pictures, ~10-20x slower in a software renderer). ``instruction``: the sentence the policy reads,
    instead of the task's own (words outside the vocabulary read as ``<unk>``, with a warning).
    ``observation="image"`` returns the (H, W, 3) uint8 camera image alone, for image-only policies
    (the CNN actor-critic); the default ``"packed"`` carries image, instruction and proprio.
    """

    metadata = {"render_modes": ["rgb_array"]}
    simulator_model_arrays = ("body_pos", "body_quat", "site_pos", "site_quat", "geom_pos", "geom_quat")
    """The ``MjModel`` arrays MetaWorld's resets rewrite (goal sites, object placements): checkpointed with the env."""

    def __init__(
        self,
        task: str,
        height: int = 64,
        width: int = 64,
        camera: str = "corner",
        flip: bool | None = None,
        proprio: bool = True,
        text_len: int = 16,
        max_episode_steps: int = 200,
        reward: Literal["success", "dense"] = "success",
        terminate_on_success: bool = True,
        success_bonus: bool = False,
        fast_render: bool = True,
        instruction: str | None = None,
        observation: Literal["packed", "image"] = "packed",
    ) -> None:
        _check_available()
        if reward not in ("success", "dense"):
            raise ValueError(f"reward: must be 'success' or 'dense', got {reward!r}")
        _check_observation(observation)
        if success_bonus and not terminate_on_success:
            raise ValueError("success_bonus: needs terminate_on_success: true (the bonus pays for the steps an "
                             "episode ended at success leaves out)")
        from metaworld.env_dict import ALL_V3_ENVIRONMENTS_GOAL_OBSERVABLE

        key = f"{task}-goal-observable"
        if key not in ALL_V3_ENVIRONMENTS_GOAL_OBSERVABLE:
            raise InputError(f"env.env_id: {task!r} is not a MetaWorld v3 task")
        self.task = task
        self.instruction = instruction_of(task, instruction)
        # A seed at construction keeps MetaWorld from drawing on (and moving) numpy's global stream.
        self._mw = ALL_V3_ENVIRONMENTS_GOAL_OBSERVABLE[key](seed=0)
        self._mw._freeze_rand_vec = False  # every reset draws new positions ...
        self._mw.seeded_rand_vec = True  # ... from the env's own seeded generator
        if not 1 <= max_episode_steps <= self._mw.max_path_length:
            raise ValueError(f"max_episode_steps: must be in [1, {self._mw.max_path_length}], got {max_episode_steps}")
        self.max_episode_steps = max_episode_steps
        self.reward_mode = reward
        self.terminate_on_success = terminate_on_success
        self.success_bonus = success_bonus
        self.use_proprio = proprio
        self.layout = _layout(height, width, text_len, proprio)
        tokenizer = WordTokenizer.versioned()
        unknown = tokenizer.unknown(self.instruction)
        if unknown:
            logger.warning("%s: the instruction's words %s are not in the vocabulary; the policy reads <unk>",
                           task, unknown)
        self._tokens = tokenizer.encode(self.instruction, text_len)
        rotate = camera in FLIPPED_CAMERAS if flip is None else flip
        self._camera = OffscreenCamera(self._mw.model, camera, height, width, rotate, fast_render)
        self.image_only = observation == "image"
        self.observation_space, self.action_space = _spaces(self.layout, observation)
        self.state = np.zeros(39)
        self._steps = 0
        self._solved = False
        self._image = np.zeros((height, width, 3), dtype=np.uint8)

    @property
    def simulator(self) -> gym.Env:
        """MetaWorld's task env this env drives (its physics and generators are checkpointed with it)."""
        return self._mw

    def _observe(self) -> np.ndarray:
        self._image = self._camera.render(self._mw.data)
        return self._current()

    def _current(self) -> np.ndarray:
        """The observation of the last rendered image and the current state."""
        if self.image_only:
            return self._image.copy()  # the caller may keep it: the next step must not change it
        proprio = self.state[:PROPRIO_DIM] if self.use_proprio else np.zeros(0)
        return self.layout.pack(self._image, self._tokens, proprio)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        if seed is not None:
            self._mw.seed(seed)
            self.action_space.seed(seed)
        self.state, _ = self._mw.reset()
        self._steps = 0
        self._solved = False
        return self._observe(), {"success": 0.0, "is_success": 0.0}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        reward, terminated, truncated, info = self._advance(action)
        return self._observe(), reward, terminated, truncated, info

    def step_without_render(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        """``step`` without the camera image: physics, reward and proprio only, for an action inside a chunk
        whose next observation nobody reads. The observation returned holds the previous image (stale), unless
        the episode ends here: its last observation is then rendered (a truncated episode bootstraps from it)."""
        reward, terminated, truncated, info = self._advance(action)
        if terminated or truncated:
            return self._observe(), reward, terminated, truncated, info
        return self._current(), reward, terminated, truncated, info

    def _advance(self, action: np.ndarray) -> tuple[float, bool, bool, dict]:
        """One physics step of the task: reward, terminated, truncated, info (nothing rendered)."""
        action = np.clip(np.asarray(action, dtype=np.float32), -1.0, 1.0)
        self.state, dense, _, _, info = self._mw.step(action)
        self._steps += 1
        success = float(info["success"]) > 0.0
        reward = float(success) if self.reward_mode == "success" else float(dense) / 10.0
        terminated = success and self.terminate_on_success
        if terminated and self.success_bonus:
            reward += float(self.max_episode_steps - self._steps)
        truncated = not terminated and self._steps >= self.max_episode_steps
        self._solved |= success
        # is_success: solved at any step so far (the embodied workflow's env/success_rate reads it at episode end)
        return reward, terminated, truncated, {"success": float(success), "is_success": float(self._solved)}

    def render(self) -> np.ndarray:
        """The last observed camera image (H, W, 3) uint8."""
        return self._image.copy()

    def close(self) -> None:
        self._camera.close()
        self._mw.close()
