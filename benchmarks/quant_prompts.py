"""The text bench_quantized.py scores and calibrates on: evaluation prompts, held-out prompts, calibration paragraphs.

The three sets share no sentence (bench_quantized.check_disjoint, tested in tests/test_quantizers.py). EVAL_PROMPTS
were fixed before any recipe was changed and the recipe variants were then compared on them; HELDOUT_PROMPTS were
written after the recipes were fixed (2026-11-30) and no choice was made on them: their score is the unbiased one.
"""

# the recipe variants were compared on these 4 prompts (64 greedy steps each; one token of one prompt = 0.4 points
# of the mean):
# story, encyclopedic prose, code, chat; none of their text is in CALIBRATION (checked in main: the recipes are not
# tuned on what they are scored on)
EVAL_PROMPTS = [
    "Once upon a time, in a small village at the edge of a great forest, there lived",
    "The Great Barrier Reef, off the coast of Queensland in Australia, is the largest coral reef system in the world."
    " It is made up of",
    'def fibonacci(n):\n    """Return the n-th Fibonacci number, computed iteratively."""\n',
    "User: What are three simple ways to save energy at home?\nAssistant:",
]
# never used to choose anything: news, instructions, arithmetic, a dialogue turn
HELDOUT_PROMPTS = [
    "The city council voted on Monday evening to approve a new plan for the harbour district, which will",
    "How to repot a houseplant:\n1. Water the plant a day before.\n2.",
    "Q: Sarah has 14 apples and gives 5 to her brother. How many apples does she have left?\nA:",
    "Customer: Hi, my laptop will not turn on after the update last night.\nSupport agent:",
]
# realistic calibration: 12 paragraphs of varied text (prose, code, dialogue, maths), 60-110 tokens each; eight
# 5-13-token prompts left NNCF int8 at 44 % agreement on OpenVINO, these at 84 % (same recipe)
CALIBRATION = [
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg combined movable metal type, oil-based ink and a wooden press adapted from wine making. Within fifty years, presses had spread to more than two hundred cities across Europe, and the price of books fell sharply, which helped literacy grow among merchants and craftsmen.",
    "def merge_sort(values):\n    if len(values) <= 1:\n        return values\n    middle = len(values) // 2\n    left = merge_sort(values[:middle])\n    right = merge_sort(values[middle:])\n    result = []\n    while left and right:\n        result.append(left.pop(0) if left[0] <= right[0] else right.pop(0))\n    return result + left + right\n",
    "Photosynthesis is the process by which green plants, algae and some bacteria turn light energy into chemical energy. In the chloroplasts, chlorophyll absorbs sunlight, water molecules are split, and carbon dioxide from the air is fixed into sugars that the plant uses to grow, releasing oxygen as a by-product.",
    "Dear Ms. Thompson,\n\nThank you for your letter of March 3rd regarding the delayed shipment. I have checked with our warehouse team, and the order left our facility yesterday morning. You should receive it within three business days. Please accept our apologies for the inconvenience, and let me know if there is anything else I can do.\n\nBest regards,\nDaniel",
    "User: Can you explain what a black hole is in simple terms?\nAssistant: A black hole is a region of space where gravity is so strong that nothing, not even light, can escape from it. It forms when a very massive star runs out of fuel and collapses under its own weight. The boundary around it is called the event horizon.",
    "A young fox lived at the edge of a quiet meadow on a hill. Every morning she watched the farmer's chickens from behind the old stone wall, planning how she might sneak into the coop. One day, however, she found a wounded sparrow in the grass, and everything she had planned began to change.",
    "To make a simple tomato soup, heat two tablespoons of olive oil in a large pot and cook one chopped onion until soft. Add three cloves of garlic, a kilogram of ripe tomatoes and half a litre of vegetable stock. Simmer for twenty minutes, blend until smooth, and season with salt, pepper and fresh basil.",
    "The stock market fell sharply on Tuesday after the central bank signalled that interest rates would stay higher for longer than investors had expected. Technology shares led the decline, while energy companies gained as oil prices rose for the third day in a row. Analysts warned that volatility could continue into next month.",
    "Question: A train travels 240 kilometres in 3 hours. What is its average speed?\nAnswer: The average speed is the distance divided by the time, so 240 km / 3 h = 80 km/h. Question: If it keeps this speed, how far will it travel in 5 hours?\nAnswer: 80 km/h times 5 h is 400 km.",
    "The mitochondria are often called the powerhouses of the cell because they produce most of the cell's supply of adenosine triphosphate, the molecule that stores and carries energy. They have their own small genome, which is inherited from the mother, and scientists believe they descended from bacteria that were engulfed by early cells.",
    "In 1969, the Apollo 11 mission landed the first humans on the Moon. Neil Armstrong and Buzz Aldrin spent about two and a half hours walking on the surface, collecting rock samples and setting up experiments, while Michael Collins orbited above in the command module. The astronauts returned safely to Earth on July 24.",
    "import numpy as np\n\n# compute the mean and standard deviation of each column\ndata = np.loadtxt('measurements.csv', delimiter=',', skiprows=1)\nmeans = data.mean(axis=0)\nstds = data.std(axis=0)\nfor name, mean, std in zip(['temperature', 'pressure', 'humidity'], means, stds):\n    print(f'{name}: {mean:.2f} +/- {std:.2f}')\n",
]
